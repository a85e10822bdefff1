"""``ddp_tutorial.capstone.resume``: saved with DCP under one layout, resumed under another, as if uninterrupted.

One 4-rank launch: 2 steps under dp2 x tp2 then a save, a load under tp2 x pp2 (other shards,
other stages) and 2 more steps; the 4 losses and the final weights must equal one process's 4
uninterrupted steps.
"""

from __future__ import annotations

from ddp_tutorial.capstone.composed import TOLERANCE, compare
from ddp_tutorial.capstone.reference import GPTRun, train_one_process
from ddp_tutorial.capstone.resume import parse_layout, save_and_resume
from ddp_tutorial.launch import spawn


def test_parse_layout():
    assert parse_layout("dp=2,tp=2") == {"dp": 2, "tp": 2} and parse_layout("pp=4") == {"pp": 4}


def test_resumed_under_another_layout_equals_the_uninterrupted_run(tmp_path):
    path = str(tmp_path / "ckpt")
    result = spawn(save_and_resume, 4, args=({"dp": 2, "tp": 2}, {"tp": 2, "pp": 2}, path), timeout=240)[0]
    assert (tmp_path / "ckpt" / ".metadata").is_file()  # DCP's last write: the checkpoint is complete
    reference = train_one_process(GPTRun(), 4)
    diff = compare(result, reference)
    assert diff["loss"] < TOLERANCE and diff["weights"] < TOLERANCE, diff
    # The resumed run starts where the saved one stopped, not from the initial weights.
    assert reference["losses"][0] - result["losses"][2] > 0.5
