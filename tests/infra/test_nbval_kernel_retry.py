"""tests/nbval_kernel_retry.py: a kernel that dies while it starts is started again, and says why."""

import nbval.kernel
import pytest

from tests.nbval_kernel_retry import TRIES, RetryingKernel

REAL_START = nbval.kernel.start_new_kernel


def dying_starts(monkeypatch, failures: int) -> list[str]:
    """Make the first ``failures`` kernel starts die as stop 45's did; return the names of the calls."""
    calls = []

    def start(**kwargs):
        calls.append(kwargs["kernel_name"])
        if len(calls) <= failures:
            kwargs["stderr"].write(b"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:5')\n")
            kwargs["stderr"].flush()
            raise RuntimeError("Kernel died before replying to kernel_info")
        return REAL_START(**kwargs)

    monkeypatch.setattr(nbval.kernel, "start_new_kernel", start)
    return calls


def test_a_kernel_that_dies_once_is_started_again_and_runs_code(monkeypatch, capsys, tmp_path):
    calls = dying_starts(monkeypatch, failures=1)
    kernel = RetryingKernel(nbval.kernel.CURRENT_ENV_KERNEL_NAME, cwd=str(tmp_path))
    try:
        reply = kernel.kc.execute_interactive("import os; print(os.getcwd())", timeout=60)
        assert reply["content"]["status"] == "ok"
    finally:
        kernel.stop()
    assert len(calls) == 2
    err = capsys.readouterr().err
    assert "Kernel died before replying to kernel_info" in err and "Address already in use" in err
    assert f"starting it again (2/{TRIES})" in err


def test_a_kernel_that_keeps_dying_fails_with_its_stderr(monkeypatch):
    calls = dying_starts(monkeypatch, failures=TRIES)
    with pytest.raises(RuntimeError, match=rf"kernel_info \({TRIES} starts; the kernel's stderr: .*Address already in use"):
        RetryingKernel(nbval.kernel.CURRENT_ENV_KERNEL_NAME)
    assert len(calls) == TRIES
