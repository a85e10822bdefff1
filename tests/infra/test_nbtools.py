"""The notebook helpers: stable numbers and stable error lines."""

from __future__ import annotations

import pytest
import torch


def test_significant_keeps_digits_not_decimals():
    from ddp_tutorial.nbtools import significant
    assert significant({"loss": [0.024123, 2.18519], "acc": (0.98329,)}, 3) == {"loss": [0.0241, 2.19], "acc": (0.983,)}
    assert str(significant(-0.000001, 2)) == "-1e-06"
    assert significant(torch.tensor([1234.5]), 2) == [1200.0]


def test_error_summary_names_type_rank_and_phrases():
    from ddp_tutorial.launch import WorkerError
    from ddp_tutorial.nbtools import error_summary
    err = WorkerError(1, "RuntimeError: [../gloo/transport.cc:42] Timed out waiting 1500ms for recv")
    assert error_summary(err, "Timed out") == "WorkerError from rank 1 (RuntimeError): says 'Timed out'"
    assert error_summary(ValueError("x must be set")) == "ValueError"
    with pytest.raises(AssertionError, match="(?s)lacks \\['hang'\\].*Timed out waiting"):
        error_summary(err, "Timed out", "hang")


def test_short_paths_hides_the_checkout_the_environment_and_named_folders(tmp_path):
    import sysconfig
    from pathlib import Path

    import ddp_tutorial
    from ddp_tutorial.nbtools import short_paths

    checkout = Path(ddp_tutorial.__file__).resolve().parent.parent
    packages = sysconfig.get_paths()["purelib"]
    text = (f'File "{packages}/torch/x.py", line 1\nFile "{checkout}/ddp_tutorial/cluster/elastic.py"\n'
            f"error_file: {tmp_path}/logs/error.json")
    assert short_paths(text, workdir=tmp_path) == ('File "<site-packages>/torch/x.py", line 1\n'
                                                   'File "ddp_tutorial/cluster/elastic.py"\n'
                                                   "error_file: <workdir>/logs/error.json")
