"""A throwaway two-node Slurm on this machine, for ``make slurm-test`` (lesson 16's scripts).

munged with its socket in a temporary folder (mode 711), slurmctld, and two slurmd
(``-N n1`` and ``-N n2``, each with its own ``Port`` and ``NodeAddr=127.0.0.1``): two
"nodes" on one host. Every daemon runs in the foreground as our child, every path
(state, spool, pid files, logs) is under the folder, and ``slurm_cluster()`` always
tears down: ``scancel`` and a bounded wait, ``scontrol shutdown``, munged by its pid
file, then a check that no process of this cluster is left (killed and reported if so).
Needs root and Debian's slurmctld, slurmd, slurm-client and munge.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ddp_tutorial.launch import free_port

NODES = ("n1", "n2")
CPUS_PER_NODE = 2
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the throwaway Slurm (not root, a package missing)."""


def missing_requirements() -> list[str]:
    """What stops ``slurm_cluster`` here, each with how to get it; empty when nothing does."""
    problems = []
    if os.geteuid() != 0:
        problems.append("root: slurmd starts each job's tasks as the submitting user, so it runs as root "
                        "(run `make slurm-test` as root, e.g. in a container or CI)")
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    commands = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
                "mungekey": "munge"}
    absent = sorted({pkg for cmd, pkg in commands.items() if shutil.which(cmd, path=path) is None})
    if absent:
        problems.append(f"the Debian packages {' '.join(absent)}: "
                        "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge")
    return problems


SLURM_CONF = """\
ClusterName=tutorial
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
# our munged's socket; cred_expire: a requeued job may start again after 6 s, not 121 s
AuthInfo=socket={root}/munge/munge.socket.2,cred_expire=5
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.%n.log
# no cgroups in a container: track a job's processes by process group
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=5
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """The running cluster: submit with ``sbatch``, watch with ``job`` / ``wait``."""

    def __init__(self, root: str):
        self.root = root
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.env["PATH"] = self.env.get("PATH", "") + ":/usr/sbin:/sbin"
        self.procs: dict[str, subprocess.Popen] = {}

    # -- start ------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        munge = os.path.join(self.root, "munge")
        os.makedirs(munge, mode=0o711)
        os.chmod(munge, 0o711)  # munged refuses a socket folder others could write to
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.root, sub))
        key = os.path.join(munge, "munge.key")
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, env=self.env,
                       capture_output=True, timeout=10)
        self._daemon("munged", ["munged", "--foreground", f"--socket={munge}/munge.socket.2",
                                f"--key-file={key}", f"--pid-file={munge}/munged.pid",
                                f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"])
        self._until(lambda: os.path.exists(f"{munge}/munge.socket.2"), deadline, "munged's socket")
        ports = [free_port() for _ in range(1 + len(NODES))]
        nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname=localhost Port={p} "
                          f"CPUs={CPUS_PER_NODE} RealMemory=1000" for n, p in zip(NODES, ports[1:]))
        with open(self.conf, "w") as f:
            f.write(SLURM_CONF.format(root=self.root, ctld_port=ports[0], nodes=nodes, node_names=",".join(NODES)))
        self._daemon("slurmctld", ["slurmctld", "-D", "-i"])
        self._until(lambda: self.command(["scontrol", "ping"], check=False).returncode == 0, deadline, "slurmctld")
        for node in NODES:
            self._daemon(f"slurmd-{node}", ["slurmd", "-D", "-N", node])
        self._until(lambda: self.command(["sinfo", "-h", "-o", "%T"], check=False).stdout.split() == ["idle"],
                    deadline, "both nodes idle")

    def _daemon(self, name: str, cmd: list[str]) -> None:
        log = open(os.path.join(self.root, f"{name}.stdout"), "wb")
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _until(self, ready, deadline: float, what: str) -> None:
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode} while waiting for {what}:\n"
                                       f"{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited too long for {what}:\n{self.logs()}")
            time.sleep(0.2)

    def command(self, cmd: list[str], check: bool = True, timeout: float = 20.0, cwd: str | None = None,
                env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm command (``scancel``, ``squeue``, ...) against this cluster, bounded by ``timeout``."""
        result = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip()}")
        return result

    # -- jobs -------------------------------------------------------------------------------
    def sbatch(self, script: str, *args: str, cwd: str, options: tuple[str, ...] = (),
               env: dict | None = None) -> int:
        """Submit ``script`` (a path) from ``cwd``; ``args`` go to the script; returns the job id."""
        job_env = dict(self.env, **(env or {}))
        out = self.command(["sbatch", "--parsable", *options, script, *args], cwd=cwd, env=job_env).stdout
        return int(out.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (no accounting database here, so no sacct)."""
        out = self.command(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id: int, timeout: float, until=None) -> dict[str, str]:
        """Poll until the job has finished (or ``until(fields)`` holds); bounded, never ``sbatch --wait``.

        A job that can never be scheduled stays PENDING forever: the timeout says so, with its reason.
        """
        deadline = time.monotonic() + timeout
        done = until or (lambda fields: fields.get("JobState") in FINISHED)
        while True:
            fields = self.job(job_id)
            if done(fields):
                return fields
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {fields.get('JobState')} (reason {fields.get('Reason')}) "
                                   f"after {timeout:g} s")
            time.sleep(0.3)

    def logs(self) -> str:
        parts = []
        for name in sorted(os.listdir(self.root)):
            if name.endswith((".log", ".stdout")):
                with open(os.path.join(self.root, name), errors="replace") as f:
                    parts.append(f"--- {name} ---\n" + "".join(f.readlines()[-15:]))
        return "\n".join(parts)

    # -- stop -------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Tear everything down; return the processes that had to be killed (empty when clean)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.command(["scancel", "--quiet", "--user=root"], check=False, timeout=10)
                deadline = time.monotonic() + 30
                while self.command(["squeue", "-h", "-o", "%i"], check=False, timeout=10).stdout.strip():
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.3)
                self.command(["scontrol", "shutdown"], check=False, timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for name, proc in self.procs.items():
            if name.startswith("slurm"):
                _wait(proc, 15)
        pid_file = os.path.join(self.root, "munge", "munged.pid")
        if os.path.exists(pid_file):
            with open(pid_file) as f:
                try:
                    os.kill(int(f.read().strip()), signal.SIGTERM)
                except (ValueError, ProcessLookupError):
                    pass
        if "munged" in self.procs:
            _wait(self.procs["munged"], 10)
        left = leftover_processes(self.root)
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            _wait(proc, 5)
        return [f"{pid} {cmd}" for pid, cmd in left]


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def leftover_processes(root: str) -> list[tuple[int, str]]:
    """Live processes of this cluster: its root in their command line or environment (jobs too)."""
    found = []
    marker = root.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # a zombie is already gone; its parent reaps it
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except (OSError, IndexError):
            continue
        if marker in cmdline or marker in environ:
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


@contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running two-node Slurm; torn down however the body ends. Fails if a process survives."""
    problems = missing_requirements()
    if problems:
        raise SlurmUnavailable("make slurm-test needs " + "; and ".join(problems))
    root = tempfile.mkdtemp(prefix="ddp-slurm-")
    os.chmod(root, 0o711)
    cluster = SlurmCluster(root)
    left: list[str] = []
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.stop()
        if not left:
            shutil.rmtree(root, ignore_errors=True)
    if left:
        raise RuntimeError(f"processes of the Slurm cluster outlived its teardown (killed now): {left}; "
                           f"logs in {root}")
