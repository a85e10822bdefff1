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
