"""Spawn targets that leave processes behind, for tests/infra/test_launch.py (spawned functions must live in a module).

Each starts ``sleep`` through ``sh``, which first writes the pid it will have into ``pid_dir``
(``exec`` keeps the pid), so a test knows which processes to look for afterwards.
"""

from __future__ import annotations

import os
import subprocess
import time


def start_sleeper(pid_dir: str, name: str, **popen) -> None:
    """``sleep 600`` that wrote its pid to ``pid_dir/name.pid`` before it started sleeping."""
    path = os.path.join(pid_dir, f"{name}.pid")
    subprocess.Popen(["sh", "-c", f'echo $$ > "{path}.tmp" && mv "{path}.tmp" "{path}" && exec sleep 600'], **popen)
    while not os.path.exists(path):
        time.sleep(0.01)


def leave_session_child(rank: int, world_size: int, pid_dir: str) -> int:
    """A child in a session of its own (out of the rank's process group), left running."""
    start_sleeper(pid_dir, f"session{rank}", start_new_session=True)
    return rank


def leave_orphan(rank: int, world_size: int, pid_dir: str) -> int:
    """A grandchild in its own session whose parent exits at once: init would adopt it, not the rank."""
    path = os.path.join(pid_dir, f"orphan{rank}.pid")
    script = (f'echo $$ > "{path}.tmp" && mv "{path}.tmp" "{path}" && exec sleep 600')
    subprocess.run(["env", "-i", "setsid", "sh", "-c", f"sh -c '{script}' &"], check=True)
    while not os.path.exists(path):
        time.sleep(0.01)
    return rank


def leave_child_and_die(rank: int, world_size: int, pid_dir: str) -> None:
    """A child in its own session, then the rank ends abruptly: it cannot stop the child itself."""
    start_sleeper(pid_dir, f"abrupt{rank}", start_new_session=True)
    os._exit(3)


def hang_with_session_child(rank: int, world_size: int, pid_dir: str) -> None:
    """A child in its own session, then a hang: the launcher stops both at its timeout."""
    start_sleeper(pid_dir, f"hung{rank}", start_new_session=True)
    time.sleep(3600)


def use_a_forkserver(rank: int, world_size: int) -> list[int]:
    """A child started through multiprocessing's forkserver, which outlives it: the forkserver's pid."""
    import multiprocessing

    from ddp_tutorial.launch.procs import HELPERS, children_by_parent, command_line

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([])
    child = ctx.Process(target=os.getpid)
    child.start()
    child.join()
    return [pid for pid in children_by_parent().get(os.getpid(), []) if HELPERS.search(command_line(pid))]
