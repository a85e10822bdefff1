"""ddp_tutorial.launch: the contract of spawn() and torchrun() in DESIGN.md.

Covers ``ddp_tutorial.launch.spawner``, ``ddp_tutorial.launch.spec``, ``ddp_tutorial.launch.child``,
``ddp_tutorial.launch.errors``, ``ddp_tutorial.launch.commands``, ``ddp_tutorial.launch.procs``,
``ddp_tutorial.launch.output``, ``ddp_tutorial.launch.stopping``, ``ddp_tutorial.comm.hello``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import launch_workers as w
import pytest
import stray_workers as strays

from ddp_tutorial.launch import (
    LaunchSpec,
    TorchrunError,
    TorchrunResult,
    WorkerError,
    WorkerTimeout,
    run_command,
    spawn,
    torchrun,
    torchrun_command,
    warm_up,
)
from ddp_tutorial.launch.errors import LaunchInterrupted, rank_range, stopped_message
from ddp_tutorial.launch.procs import Leftover, still_running
from ddp_tutorial.pitfalls.strays import alive  # a process that exists and is not a zombie

pytestmark = pytest.mark.timeout(120)


def assert_all_gone(pids, within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], "child processes outlived the launch"


def pids_in(directory: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(directory.glob("*.pid"))]


def _wait_for_pid_files(pid_dir: Path, count: int, proc: subprocess.Popen, within: float = 60) -> list[int]:
    """The pids written to ``pid_dir`` once there are ``count`` of them (or ``proc`` ended, or time ran out)."""
    deadline = time.monotonic() + within
    while len(pids_in(pid_dir)) < count and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids_in(pid_dir)


def _ctrl_c_as_in_a_terminal() -> None:
    # A job started in the background (`cmd &` in a script, some CI runners) inherits SIGINT
    # ignored, and Python then never raises KeyboardInterrupt: give the caller the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _expect_keyboard_interrupt_exit(proc: subprocess.Popen, err, stopped: str) -> None:
    """``proc`` exits within 15 s after SIGINT; the last words on ``err``: ``stopped``, nothing left running."""
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the interrupted caller did not exit (waiting for processes left running?)")
    err.seek(0)
    stderr = err.read()
    last = stderr.rstrip().splitlines()[-1]
    assert proc.returncode != 0 and last == f"ddp_tutorial.launch.errors.LaunchInterrupted: {stopped} stopped, " \
        "nothing left running", stderr
    assert "multiprocessing" not in stderr and "selectors" not in stderr, stderr  # the waiting loop's frames


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_results_are_ordered_by_rank(world_size):
    results = spawn(w.identify, world_size, timeout=60)
    assert [r[:4] for r in results] == [(r, world_size, r, world_size) for r in range(world_size)]
    assert_all_gone([r[4] for r in results])


def test_raising_rank_gives_worker_error_and_stops_the_others(tmp_path):
    # The others wait in a barrier for the failed rank: they end because the launcher stops them,
    # not at the launch's timeout, which is longer than this test's own (pytest-timeout fails it).
    with pytest.raises(WorkerError) as info:
        spawn(w.fail_on, 3, args=(1, str(tmp_path)), timeout=3600)
    err = info.value
    assert not isinstance(err, WorkerTimeout)
    assert err.rank == 1
    assert "rank 1" in str(err) and "ValueError: boom from rank 1" in str(err)
    assert "fail_on" in err.remote_traceback  # the remote traceback, not the parent's
    assert len(pids_in(tmp_path)) == 3
    assert_all_gone(pids_in(tmp_path))


def test_hanging_rank_gives_worker_timeout_within_the_timeout(tmp_path):
    # 10 s, not less: the timeout also bounds gloo's set-up, and rank 0 must get
    # through it and finish within the timeout on a loaded machine too.
    warm_up()  # the forkserver's start (seconds, more on a loaded machine) is not what is measured
    start = time.monotonic()
    with pytest.raises(WorkerTimeout) as info:
        spawn(w.hang_on, 2, args=(1, str(tmp_path)), timeout=10)
    elapsed = time.monotonic() - start
    # Not before the timeout (an order of events: the deadline came first); the upper bound is a
    # hang guard, not a speed claim: 10 s, then at most 1 s + 5 s to stop them, and a loaded machine.
    assert 10 <= elapsed < 60
    assert (tmp_path / "0.done").exists() and not (tmp_path / "1.done").exists()
    assert info.value.ranks == [1]
    assert "ranks still running: [1]" in str(info.value)
    assert_all_gone(pids_in(tmp_path))


_INTERRUPTED = """
import sys
sys.path.insert(0, %r)
import launch_workers as w
from ddp_tutorial.launch import spawn
spawn(w.hang_with_grandchild, 2, args=(%r, %r), timeout=60)
"""


def test_an_interrupt_message_names_the_ranks_and_anything_left():
    assert [rank_range(r) for r in ([0], [0, 1], range(4), [0, 2])] == ["rank 0", "ranks 0-1", "ranks 0-3",
                                                                        "ranks 0, 2"]
    assert stopped_message("ranks 0-1", []) == "ranks 0-1 stopped, nothing left running"
    left = stopped_message("ranks 0-1", [11, 12])
    assert left.startswith("ranks 0-1 stopped, but 2 of their processes still run (pids 11, 12)"), left
    assert issubclass(LaunchInterrupted, KeyboardInterrupt)  # "Run All" stops at it


def test_still_running_sees_what_a_process_group_holds_until_it_is_gone():
    # what a rank started stays in the rank's group after the rank is killed
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(still_running([leader.pid], wait=0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        members = still_running([leader.pid], wait=0)
        assert leader.pid in members and len(members) == 2, members
        os.kill(leader.pid, signal.SIGKILL)
        leader.wait()
        assert still_running([leader.pid], wait=0) == [p for p in members if p != leader.pid]
    finally:
        try:
            os.killpg(leader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert still_running([leader.pid], wait=2) == []


def _stopping_began(pid_dir: Path, pids: list[int]) -> bool:
    """The launcher has begun stopping: a rank's SIGTERM note, or a rank's own process already killed
    (``stop_ranks`` pauses the ranks and kills what they started first). On a loaded machine the note
    alone may never come: the rank's handler may not run within the 1 s grace before SIGKILL."""
    return bool(list(pid_dir.glob("*.term"))) or not all(alive(p) for p in pids)


@pytest.mark.parametrize("twice", [False, pytest.param(True, marks=pytest.mark.slow)],  # slow: make test < 12 min
                         ids=["once", "again_while_stopping"])
def test_an_interrupt_stops_every_rank_and_what_it_started(tmp_path, twice):
    # Ctrl-C, or Jupyter's "interrupt kernel": SIGINT to the caller -> KeyboardInterrupt in
    # spawn. An impatient user presses it again while the ranks are being stopped: that
    # must not cut the stopping short. (The ranks are slow to stop then, so the second
    # interrupt surely lands while the launcher waits for them.)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    code = _INTERRUPTED % (str(Path(__file__).parent), str(pid_dir), twice)
    # stderr to a file, not a pipe: a leftover process would hold a pipe open
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=_ctrl_c_as_in_a_terminal)
        try:
            pids = _wait_for_pid_files(pid_dir, 4, proc)  # two ranks and the process each started
            assert len(pids) == 4 and all(alive(p) for p in pids), (pids, proc.poll())
            proc.send_signal(signal.SIGINT)
            if twice:
                deadline = time.monotonic() + 30
                while not _stopping_began(pid_dir, pids) and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert _stopping_began(pid_dir, pids), "the launcher did not start stopping the ranks"
                proc.send_signal(signal.SIGINT)
            _expect_keyboard_interrupt_exit(proc, err, "ranks 0-1")
            assert_all_gone(pids)
        finally:
            proc.kill()
            proc.wait()
            for pid in pids_in(pid_dir):  # a failed run must not leave them behind either
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_a_rank_that_dies_without_an_exception_is_reported():
    with pytest.raises(WorkerError, match=r"rank 1 failed: process exited with code 3"):
        spawn(w.die_on, 2, args=(1,), timeout=30)


def test_unpicklable_result_is_reported():
    with pytest.raises(WorkerError, match="cannot be pickled"):
        spawn(w.unpicklable, 2, timeout=30)


def test_processes_started_by_a_rank_are_stopped_too():
    grandchildren = spawn(w.leave_grandchild, 2, timeout=30)
    assert_all_gone(grandchildren)


def test_a_rank_may_use_dataloader_worker_processes():
    left = []
    assert spawn(w.loader_in_worker, 2, timeout=60, leftovers=left) == [28.0, 28.0]
    assert left == []  # the workers ended with their loader: nothing was left running


def _noted(pid_dir: Path, prefix: str) -> dict[int, int]:
    """rank -> pid, from the ``<prefix><rank>.pid`` files stray_workers' sleepers wrote."""
    return {int(p.stem.removeprefix(prefix)): int(p.read_text()) for p in pid_dir.glob(f"{prefix}*.pid")}


needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="Linux: reads /proc")


@needs_proc
def test_a_child_in_a_session_of_its_own_is_stopped_and_named(tmp_path):
    # start_new_session=True takes it out of the rank's process group: stopping the group misses it
    left = []
    assert spawn(strays.leave_session_child, 2, args=(str(tmp_path),), timeout=60, leftovers=left) == [0, 1]
    noted = _noted(tmp_path, "session")
    assert len(noted) == 2
    assert_all_gone(noted.values())
    assert left == [Leftover(rank, pid, "sleep 600") for rank, pid in sorted(noted.items())]


@needs_proc
def test_an_orphan_with_an_environment_of_its_own_is_still_found(tmp_path):
    # its parent exits at once (init would adopt it) and `env -i` drops the launch's tag: only the
    # rank, a subreaper, adopting it finds it
    left = []
    assert spawn(strays.leave_orphan, 1, args=(str(tmp_path),), timeout=60, init_process_group=False,
                 leftovers=left) == [0]
    noted = _noted(tmp_path, "orphan")
    assert_all_gone(noted.values())
    assert left == [Leftover(0, noted[0], "sleep 600")]


@needs_proc
def test_a_child_of_a_rank_that_died_abruptly_is_stopped(tmp_path):
    # os._exit: the rank cannot stop what it started; the launch's tag in the child's environment finds it
    left = []
    with pytest.raises(WorkerError, match="rank 0 failed: process exited with code 3"):
        spawn(strays.leave_child_and_die, 1, args=(str(tmp_path),), timeout=60, init_process_group=False,
              leftovers=left)
    noted = _noted(tmp_path, "abrupt")
    assert_all_gone(noted.values())
    assert left == [Leftover(0, noted[0], "sleep 600")]


@needs_proc
def test_a_hanging_rank_and_its_child_in_another_session_are_both_stopped(tmp_path):
    left = []
    with pytest.raises(WorkerTimeout):  # no process group to set up: 3 s are the hang alone
        spawn(strays.hang_with_session_child, 1, args=(str(tmp_path),), timeout=3, init_process_group=False,
              leftovers=left)
    noted = _noted(tmp_path, "hung")
    assert_all_gone(noted.values())
    assert left == [Leftover(0, noted[0], "sleep 600")]


def test_multiprocessing_s_own_helpers_are_not_counted_as_left_running():
    # a rank that used multiprocessing's forkserver has that server until it exits: not the learner's stray
    left = []
    servers = spawn(strays.use_a_forkserver, 1, timeout=60, init_process_group=False, leftovers=left)
    assert servers[0], "the rank started no forkserver: nothing was tested"
    assert left == []
    assert_all_gone(servers[0])  # it ended with its rank


def test_output_is_relayed_in_rank_order(capsys):
    spawn(w.chatty, 3, timeout=30)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[rank")]
    expected = []
    for r in range(3):
        expected += [f"[rank {r}] first line of rank {r}", f"[rank {r}] second line of rank {r}",
                     f"[rank {r}] raw fd write of rank {r}"]
    assert lines == expected


def test_quiet_drops_relayed_output(capsys):
    spawn(w.chatty, 2, timeout=30, quiet=True)
    assert "[rank" not in capsys.readouterr().out


def test_without_init_the_worker_initialises_itself_on_localhost():
    results = spawn(w.self_init, 2, init_process_group=False, timeout=30)
    assert results == [("127.0.0.1", [3.0, 3.0, 3.0])] * 2


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_rendezvous_and_gloo_listen_on_loopback_only():
    for mine, store in spawn(w.listening_sockets, 2, timeout=30):
        assert mine and all(addr.startswith("127.0.0.1:") for addr in mine), mine
        assert store and all(addr.startswith("127.0.0.1:") for addr in store), store


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_world_size_must_be_a_positive_whole_number(bad):
    with pytest.raises(ValueError, match="world_size must be a whole number >= 1"):
        spawn(w.identify, bad)


def test_non_callable_target_is_rejected():
    with pytest.raises(TypeError, match="needs a function"):
        spawn("identify", 2)


def test_main_defined_target_is_refused_with_advice():
    def worker(rank, world_size):
        return rank

    worker.__module__ = "__main__"
    worker.__qualname__ = "worker"
    with pytest.raises(ValueError, match=r"defined in __main__.*Move it into a module"):
        spawn(worker, 2)


def test_lambda_target_is_refused():
    with pytest.raises(ValueError, match="lambda or nested function"):
        spawn(lambda rank, world_size: rank, 2)


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_two_launches_in_two_processes_at_once_both_succeed():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, {tests!r})
        from ddp_tutorial.launch import spawn
        from ddp_tutorial.comm.hello import all_reduce_ranks
        for _ in range(5):
            assert spawn(all_reduce_ranks, 2, quiet=True, timeout=30) == [1.0, 1.0]
        print("ok")
    """).format(tests=str(Path(__file__).parent))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    deadline = time.monotonic() + 100  # for both: inside the test's 120 s
    try:
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all(out.strip().endswith("ok") for out in outputs)


def test_a_launch_spec_is_checked_once_and_cannot_change():
    spec = LaunchSpec(w.identify, 3, args=[1, 2])
    assert spec.args == (1, 2) and spec.threads >= 1  # 0: the cores shared out between the ranks
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.world_size = 4
    env = spec.rank_env(2, 1234)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                "OMP_NUM_THREADS")} == {
        "RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234", "OMP_NUM_THREADS": str(spec.threads)}
    assert "DDP_TUTORIAL_LIVE" not in env
    assert LaunchSpec(w.identify, 2, threads=3, live=True).rank_env(0, 1)["DDP_TUTORIAL_LIVE"] == "1"
    with pytest.raises(ValueError, match="timeout must be positive"):
        LaunchSpec(w.identify, 2, timeout=0)


def test_a_rank_knows_whether_its_output_is_shown_live(capsys):
    assert spawn(w.watched, 2, timeout=30, live=False) == [False, False]
    assert spawn(w.watched, 2, timeout=30, live=True) == [True, True]


def test_torchrun_runs_a_module_and_returns_its_output():
    result = torchrun("ddp_tutorial.comm.hello", nproc_per_node=2, timeout=90)
    assert result.returncode == 0
    assert "all_reduce over 2 rank(s) on gloo: OK" in result.output


def test_torchrun_failure_raises_with_the_output():
    with pytest.raises(TorchrunError) as info:
        torchrun("ddp_tutorial.no_such_module", nproc_per_node=1, timeout=90)
    assert info.value.result.returncode != 0
    assert "No module named ddp_tutorial.no_such_module" in str(info.value)


def test_torchrun_without_check_returns_the_failure():
    result = torchrun("ddp_tutorial.no_such_module", nproc_per_node=1, timeout=90, check=False)
    assert isinstance(result, TorchrunResult)
    assert result.returncode != 0
    assert "No module named ddp_tutorial.no_such_module" in result.output


_HANGING_MODULE = """
import os, signal, time
if "IGNORE_SIGTERM" in os.environ:  # a worker that does not stop when asked
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} is waiting forever", flush=True)
if "PID_DIR" in os.environ:
    path = os.path.join(os.environ["PID_DIR"], os.environ["RANK"] + ".pid")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
time.sleep(3600)
"""


def hanging_module(directory: Path) -> tuple[str, dict]:
    """A module that hangs under torchrun, and the environment that finds it. Its name is unique,
    so it marks this run's processes (torchrun and its workers)."""
    module = f"hang_{uuid.uuid4().hex}"
    (directory / f"{module}.py").write_text(_HANGING_MODULE)
    return module, dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]))


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(cmdline.parent.name)
        if marker in text and pid != os.getpid() and alive(pid):
            found.append(pid)
    return found


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_torchrun_timeout_raises_with_the_output_and_leaves_no_process(tmp_path):
    module, env = hanging_module(tmp_path)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError) as info:
            torchrun(module, nproc_per_node=2, timeout=8, env=env)
        assert time.monotonic() - start < 60  # a hang guard: 8 s, then stopping torchrun and its workers
        message = str(info.value)
        assert "torchrun did not finish within 8 s" in message and f"-m {module}" in message
        output = message.split("--- output ---", 1)[1]
        for rank in range(2):  # what the workers printed before the timeout
            assert f"rank {rank} of 2 is waiting forever" in output, message
        deadline = time.monotonic() + 5
        while processes_mentioning(module) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes_mentioning(module), "torchrun or its workers outlived the timeout"
    finally:
        for pid in processes_mentioning(module):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_an_interrupt_stops_torchrun_and_its_workers_even_deaf_ones(tmp_path):
    # The workers ignore SIGTERM, so torchrun cannot stop them in time: the launcher must.
    module, env = hanging_module(tmp_path)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    code = f"from ddp_tutorial.launch import torchrun; torchrun({module!r}, 2, timeout=60)"
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=err,
                                env=dict(env, PID_DIR=str(pid_dir), IGNORE_SIGTERM="1"),
                                preexec_fn=_ctrl_c_as_in_a_terminal)
        try:
            assert len(_wait_for_pid_files(pid_dir, 2, proc)) == 2 and len(processes_mentioning(module)) >= 3, proc.poll()
            proc.send_signal(signal.SIGINT)
            _expect_keyboard_interrupt_exit(proc, err, "torchrun and the 2 processes it started")
            assert_all_gone(pids_in(pid_dir))
            assert not processes_mentioning(module), "torchrun or its workers outlived the interrupt"
        finally:
            proc.kill()
            proc.wait()
            for pid in processes_mentioning(module):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # make test stays under 12 minutes; make test-slow and CI run it
def test_torchrun_workers_get_one_thread_unless_told_and_lines_arrive_one_by_one(tmp_path):
    module = f"threads_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text('import os\nprint("OMP_NUM_THREADS=" + os.environ["OMP_NUM_THREADS"])\n')
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    seen = []
    result = torchrun(module, 2, env=env, timeout=90, on_line=lambda line, proc: seen.append(line))
    assert result.output.count("OMP_NUM_THREADS=1") == 2, result.output  # as torchrun's own default
    assert "Setting OMP_NUM_THREADS" not in result.output  # set by us: torchrun need not warn
    assert seen == result.output.splitlines()
    assert "OMP_NUM_THREADS=3" in torchrun(module, 1, env=env, threads=3, timeout=90).output


def test_torchrun_command_keeps_options_whose_value_is_zero():
    cmd = torchrun_command("pkg.mod", 2, local_ranks_filter=0, max_restarts=0, tee=False)
    assert "--local-ranks-filter=0" in cmd and "--max-restarts=0" in cmd
    assert not any(part.startswith("--tee") for part in cmd)


def test_torchrun_command_line():
    python = [sys.executable, "-m", "torch.distributed.run"]
    # one node: 127.0.0.1 and a free port (the port varies: compared as PORT); never --standalone
    def ported(cmd):
        return [re.sub(r"^--master-port=\d+$", "--master-port=PORT", part) for part in cmd]
    assert ported(torchrun_command("pkg.mod", 3, args=("--epochs", 2))) == python + [
        "--nproc-per-node=3", "--master-addr=127.0.0.1", "--master-port=PORT", "-m", "pkg.mod", "--epochs", "2"]
    assert ported(torchrun_command("pkg.mod", 2, max_restarts=1, no_python=False, log_dir=None,
                                   monitor_interval=0.5)) == python + [
        "--nproc-per-node=2", "--master-addr=127.0.0.1", "--master-port=PORT", "--max-restarts=1",
        "--monitor-interval=0.5", "-m", "pkg.mod"]
    # rendezvous given: left as given; True is a bare flag
    assert torchrun_command("pkg.mod", 4, args=["x"], nnodes=2, node_rank=1,
                            rdzv_endpoint="10.0.0.1:29400", rdzv_backend="c10d", redirects=True) == python + [
        "--nproc-per-node=4", "--nnodes=2", "--node-rank=1", "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-backend=c10d", "--redirects", "-m", "pkg.mod", "x"]
    assert "--standalone" not in torchrun_command("m", master_addr="h", master_port=1234)
    assert torchrun_command("m", 1, standalone=True).count("--standalone") == 1


def test_hello_runs_alone_as_a_world_of_one():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-m", "ddp_tutorial.comm.hello"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "all_reduce over 1 rank(s) on gloo: OK" in out.stdout


def test_only_a_gloo_connection_failure_at_init_counts_as_a_flake_to_retry():
    from ddp_tutorial.launch.errors import is_init_flake

    mesh = "RuntimeError: Gloo connectFullMesh failed with ... Connection closed by peer"
    assert is_init_flake({}, {0: (mesh, "", "init"), 1: (mesh, "", "init")})
    assert not is_init_flake({}, {0: (mesh, "", "run")})  # worker code had run: never retry
    assert not is_init_flake({1: None}, {0: (mesh, "", "init")})  # a rank finished its work
    assert not is_init_flake({}, {0: ("ValueError: bad backend", "", "init")})
    assert not is_init_flake({}, {})


def test_an_init_failure_is_reported_with_its_rank_and_cause():
    # both ranks fail the same way; either may be named
    with pytest.raises(WorkerError, match=r"rank [01] failed: \w+: Unknown backend type no_such_backend"):
        spawn(w.identify, 2, backend="no_such_backend", timeout=30)


@pytest.mark.timeout(120)
def test_a_quick_rank_never_tears_down_a_peer_still_in_init():
    # Seen in lesson 12: a rank through gloo's init ran a worker with no collective and
    # destroyed the group while its peer was still connecting ("Connection closed by peer").
    for _ in range(6):
        assert spawn(w.no_collective, 4, timeout=60) == [None] * 4  # the caller's environment, unchanged


def test_children_write_plain_text_even_under_a_colour_forcing_kernel(monkeypatch):
    # Jupyter kernels set FORCE_COLOR=1; Python 3.13+ then colours tracebacks written to a
    # file or pipe, and the lessons read them as text (03's mp.spawn error, 12's __main__ demo).
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert LaunchSpec(w.identify, 2).rank_env(1, 29500)["PYTHON_COLORS"] == "0"
    code = "import os; print(os.environ.get('PYTHON_COLORS'))"
    assert run_command([sys.executable, "-c", code], timeout=60).output.strip() == "0"


class RecordingView:
    """A live view that records what a person watching would have seen."""
    relay_at_end = False

    def __init__(self):
        self.statuses: list[str] = []
        self.closed = False

    def show(self, new, bars) -> None:
        pass

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def close(self) -> None:
        self.closed = True


def test_run_command_status_shows_then_follows_the_latest_line_and_is_taken_down(monkeypatch):
    import ddp_tutorial.launch.commands as commands
    view = RecordingView()
    monkeypatch.setattr(commands, "choose_view", lambda: view)
    result = run_command([sys.executable, "-c", "print('first')"], timeout=60, name="tool", status="starting tool...")
    assert result.returncode == 0 and result.output == "first\n"  # the output itself is untouched
    assert view.statuses == ["starting tool...", "tool: first"] and view.closed


def test_run_command_without_status_shows_nothing(monkeypatch):
    import ddp_tutorial.launch.commands as commands
    monkeypatch.setattr(commands, "choose_view", lambda: pytest.fail("no status: no view is needed"))
    assert run_command([sys.executable, "-c", "print('x')"], timeout=60).output == "x\n"


@pytest.mark.slow  # two torchrun starts
def test_torchrun_chooses_another_port_when_the_one_it_chose_is_taken(tmp_path, monkeypatch):
    # A port free when chosen may be taken before torchrun's store binds it (another test, another
    # program): the call chooses again, once, and the job runs.
    import socket

    from ddp_tutorial.launch import commands
    module = f"hello_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text('print("ran")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        ports = iter([taken.getsockname()[1], commands.free_port()])
        monkeypatch.setattr(commands, "free_port", lambda: next(ports))
        result = torchrun(module, 1, env=env, timeout=120)
    assert result.output.count("ran") == 1, result.output
    assert next(ports, None) is None  # both ports were asked for: the taken one, then another
