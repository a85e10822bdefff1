"""The course's single-node torchrun commands meet on 127.0.0.1, never ``--standalone`` (issue 38, lesson 09).

Measured on torch 2.9 and 2.15: whatever the flags, the store torchrun's agent hosts listens on
every interface (TCPStore has no bind address). ``--standalone`` (c10d rendezvous) opens two such
sockets and its agent unpickles the rendezvous state it reads from the store; the course's form
(``--master-addr=127.0.0.1 --master-port=P``: the static rendezvous) opens one, on the port it
names, and never unpickles. The slow test checks both from ``/proc/net/tcp`` and ``tcp6``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_tutorial import gpu_items
from ddp_tutorial.launch import torchrun, torchrun_command
from ddp_tutorial.launch.procs import descendants

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK_FLAGS = ["--master-addr=127.0.0.1", "--master-port="]


def master_port(cmd: list[str]) -> int:
    (port,) = [int(part.split("=", 1)[1]) for part in cmd if part.startswith("--master-port=")]
    return port


def test_single_node_commands_meet_on_loopback_never_standalone():
    for cmd in (torchrun_command("pkg.mod"), torchrun_command("pkg.mod", 4, ["--epochs", 2], max_restarts=1)):
        assert "--standalone" not in cmd
        assert cmd[3:5] == ["--nproc-per-node=" + cmd[3].split("=")[1], "--master-addr=127.0.0.1"], cmd
        assert 1024 <= master_port(cmd) <= 65535
    # the port is one the kernel handed out on 127.0.0.1, so it can be bound there now
    import socket
    port = master_port(torchrun_command("pkg.mod"))
    with socket.create_server(("127.0.0.1", port)):
        pass
    # a rendezvous the caller names is left alone (several nodes: lesson 09's simulated ones)
    multi = torchrun_command("m", 2, nnodes=2, node_rank=0, master_addr="10.0.0.1", master_port=29500)
    assert multi.count("--master-addr=10.0.0.1") == 1 and "--master-addr=127.0.0.1" not in multi
    assert torchrun_command("m", 1, standalone=True).count("--standalone") == 1  # asked for: given


def test_gpu_items_and_make_demo_meet_on_loopback(tmp_path):
    items = [item for item in gpu_items.ITEMS + gpu_items.SUITES if "torch.distributed.run" in item.command]
    assert items, "the GPU check runs torchrun"
    for item in items:
        assert "--standalone" not in item.command, item.name
        assert item.command[3:5] == ("--master-addr=127.0.0.1", "--master-port={port}"), item.name
    demo = subprocess.run(["make", "-n", "-W", ".venv/.installed", "demo"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    line = " ".join(demo.stdout.split("\\\n"))
    assert "torchrun --master-addr=127.0.0.1 --master-port=$(" in line and "--standalone" not in line, demo.stdout


def test_readme_shell_commands_meet_on_loopback():
    text = (ROOT / "README.md").read_text()
    assert not re.search(r"^\s*(\S+/)?torchrun .*--standalone", text, re.M)
    block = text.split("## Run a lesson's module from a shell", 1)[1].split("```", 2)[1]
    lines = block.splitlines()
    export = next(i for i, line in enumerate(lines) if line.startswith("export PET_MASTER_ADDR=127.0.0.1 "))
    assert "PET_MASTER_PORT=29500" in lines[export]
    first_torchrun = next(i for i, line in enumerate(lines) if line.startswith("torchrun "))
    assert export < first_torchrun


def test_make_install_cpu_takes_the_cpu_index_and_the_default_takes_pypi():
    def install(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "-n", "-B", "install", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
    cpu, default, bogus = install("TORCH=cpu"), install(), install("TORCH=cuda")
    pip = [line for line in cpu.stdout.splitlines() if "pip install" in line]
    assert pip and "--extra-index-url https://download.pytorch.org/whl/cpu -e '.[dev]'" in pip[0], cpu.stdout
    assert "pip install -e '.[dev]'" in " ".join(default.stdout.split()), default.stdout
    assert "download.pytorch.org" not in default.stdout
    assert bogus.returncode != 0 and "TORCH=cuda is not a build this Makefile knows" in bogus.stderr
    assert "TORCH=cpu" in bogus.stderr


def listeners() -> dict[int, tuple[str, int]]:
    """Every listening TCP socket of this network namespace: inode -> (address, port)."""
    found = {}
    for name in ("tcp", "tcp6"):
        for row in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A":  # LISTEN
                continue
            addr, port = fields[1].split(":")
            raw = bytes.fromhex(addr)  # the kernel's words, each in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found[int(fields[9])] = (str(ipaddress.ip_address(raw)), int(port, 16))
    return found


def sockets_of(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


WORKER = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
# one write(2) of a line under PIPE_BUF is atomic; print() runs unbuffered here (PYTHONUNBUFFERED) and
# writes its words one by one, so the two ranks' lines could interleave ("READYREADY 127.0.0.1  ...")
os.write(1, f"READY {os.environ['MASTER_ADDR']} {os.environ['MASTER_PORT']}\\n".encode())
while not os.path.exists(os.environ["RELEASE"]):  # the test looks at the sockets meanwhile
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


def listening_while_running(tmp_path: Path, **opts) -> dict[str, list]:
    """Run a 2-rank job by ``launch.torchrun``; once both ranks are up: who listens where."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "exposure_worker.py").write_text(WORKER)
    release = tmp_path / "release"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
               RELEASE=str(release))
    seen: dict[str, list] = {}

    def on_line(line: str, proc: subprocess.Popen) -> None:
        if "READY" in line:
            seen["ready"] = seen.get("ready", []) + [line.split("READY ")[1].split()]
        if len(seen.get("ready", [])) == 2 and "agent" not in seen:
            table = listeners()
            for role, pids in (("agent", [proc.pid]), ("ranks", descendants(proc.pid))):
                seen[role] = sorted(table[i] for pid in pids for i in sockets_of(pid) if i in table)
            release.touch()
    torchrun("exposure_worker", 2, env=env, timeout=120, on_line=on_line, **opts)
    return seen


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_the_course_command_exposes_one_store_socket_and_standalone_two(tmp_path):
    seen = listening_while_running(tmp_path / "course")
    assert seen["ranks"] and all(is_loopback(addr) for addr, _ in seen["ranks"]), seen  # gloo: 127.0.0.1
    assert seen["ready"] == [["127.0.0.1", seen["ready"][0][1]]] * 2, seen  # the ranks meet on loopback
    exposed = [(addr, port) for addr, port in seen["agent"] if not is_loopback(addr)]
    # torch gives no way to bind the agent's store to loopback: one socket on every interface,
    # the store the ranks meet at (MASTER_PORT), and nothing else
    assert exposed == [(exposed[0][0], int(seen["ready"][0][1]))] and exposed[0][0] in ("0.0.0.0", "::"), seen
    standalone = listening_while_running(tmp_path / "standalone", standalone=True)
    open_standalone = [a for a in standalone["agent"] if not is_loopback(a[0])]
    assert len(open_standalone) == 2, standalone  # the rendezvous store and the workers' store
