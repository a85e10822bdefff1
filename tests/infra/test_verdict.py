"""``ddp_tutorial.launch.verdict``: the one ending of the lessons' command lines, and that it is the only one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp_tutorial.launch.verdict import verdict

PKG = Path(__file__).resolve().parents[2] / "ddp_tutorial"
# a module writing the ending out again: 'OK' if ok else 'FAILED', in either quote style
ENDING = re.compile(r"""["']OK["']\s+if\s+\w+\s+else\s+["']FAILED["']""")


def test_ok_prints_one_line_and_returns(capsys):
    verdict(True, "a claim")
    assert capsys.readouterr().out == "OK: a claim\n"


def test_failed_prints_and_exits_1(capsys):
    with pytest.raises(SystemExit) as stop:
        verdict(False, "a claim")
    assert stop.value.code == 1 and capsys.readouterr().out == "FAILED: a claim\n"


def test_a_rank_that_does_not_report_is_silent_but_exits_the_same(capsys):
    verdict(True, "a claim", show=False)
    with pytest.raises(SystemExit) as stop:
        verdict(False, "a claim", show=False)
    assert stop.value.code == 1 and capsys.readouterr().out == ""


def test_no_other_module_writes_the_ending_out_again():
    again = [f"{p.relative_to(PKG.parent)}:{i}" for p in PKG.rglob("*.py") if p.name != "verdict.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if ENDING.search(line)]
    assert not again, "use ddp_tutorial.launch.verdict.verdict: " + ", ".join(again)
