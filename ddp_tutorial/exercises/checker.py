"""``check(name)``: run the learner's function on several world sizes and say, in one paragraph, what is wrong.

The parent never runs the learner's code. It reads the file (a syntax error or an
untouched stub is reported at once), runs the exercise's ``prepare`` if it has one (inputs
the ranks read, such as a checkpoint saved on other ranks), then for each world size starts
the ranks with ``launch.spawn``; each rank imports the file afresh (``harness.load_function``)
in a scratch working folder (``harness.in_scratch``) and runs the exercise's cases. A rank's
report, an exception, or a timeout becomes one diagnosis naming the first wrong rank and what
it got wrong, and, for a hang, the call each stuck rank is blocked in (``tracing.where_stuck``)
and the learner's line it was on (``harness.stuck_at``). A process the learner's code started
and left running is stopped by the launcher, and the verdict says so.
"""

from __future__ import annotations

import ast
import re
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from ddp_tutorial.exercises import workspace
from ddp_tutorial.exercises.exercise import Exercise
from ddp_tutorial.exercises.harness import in_scratch, stuck_at
from ddp_tutorial.exercises.registry import get
from ddp_tutorial.exercises.tracing import last_call, where_stuck
from ddp_tutorial.launch import WorkerError, WorkerTimeout, spawn
from ddp_tutorial.launch.procs import Leftover

DEFAULT_TIMEOUT = 20.0  # seconds per world size: a deadlock is reported after this


@dataclass(frozen=True)
class CheckResult:
    """``passed``, and the one-paragraph ``message`` that explains it."""

    name: str
    passed: bool
    message: str
    started: bool = True  # False: the learner's file is still the fresh stub (a to-do, not a failure)

    @property
    def verdict(self) -> str:
        """PASS, FAIL, or TO DO for an untouched stub (``check`` returns False for it all the same)."""
        return "PASS" if self.passed else "FAIL" if self.started else "TO DO"

    def __str__(self) -> str:
        return textwrap.fill(f"{self.verdict} {self.message}", width=100,
                             break_long_words=False, break_on_hyphens=False)


def check(name: str, *, file: str | Path | None = None, solution: bool = False,
          timeout: float = DEFAULT_TIMEOUT, quiet: bool = False) -> bool:
    """Check exercise ``name``: the learner's copy, or ``file``, or the reference ``solution``; print the verdict."""
    result = run_check(name, file=file, solution=solution, timeout=timeout)
    if not quiet:
        print(result)
    return result.passed


def run_check(name: str, *, file: str | Path | None = None, solution: bool = False,
              timeout: float = DEFAULT_TIMEOUT) -> CheckResult:
    """What ``check`` prints, as a ``CheckResult``."""
    e = get(name)
    if file is not None:
        source = Path(file).expanduser().absolute()
        if not source.is_file():
            raise FileNotFoundError(f"no file {file}")
        shown = workspace.shown(source)
    elif solution:
        source = workspace.solution_file(name)
        shown = workspace.shown(source)
    else:  # the learner's copy; under nbval the pristine stub in its place (workspace.fresh)
        source = workspace.stub_file(name) if workspace.fresh() else workspace.learner_file(name)
        shown = workspace.shown(workspace.learner_path(name))
    text = source.read_text(encoding="utf-8")
    try:
        ast.parse(text)
    except SyntaxError as err:
        return CheckResult(name, False, f"exercise {e.number} ({e.name}), {shown}: line {err.lineno}: "
                                        f"SyntaxError: {err.msg}. Fix it and check again")
    if untouched(text, e.function):
        return CheckResult(name, False, e.not_implemented(shown), started=False)
    left: list[tuple[int, Leftover]] = []  # (world size, what a rank left running)
    result = judge(e, source, shown, timeout, left)
    if left:
        end = "" if result.message.endswith((".", "!", "?")) else "."
        result = CheckResult(name, result.passed, f"{result.message}{end} {stopped_note(left)}", result.started)
    return result


def judge(e: Exercise, source: Path, shown: str, timeout: float, left: list[tuple[int, Leftover]]) -> CheckResult:
    """Run the ranks on every world size; the first failure's diagnosis, or the pass. ``left`` gets the leftovers."""
    fail = lambda text: CheckResult(e.name, False, f"exercise {e.number} ({e.name}), {shown}: {text}")  # noqa: E731  (a one-line helper, read beside its only use)
    total = 0
    with tempfile.TemporaryDirectory(prefix="ddp_tutorial_inputs_") as inputs:
        extra = tuple(e.prepare(inputs)) if e.prepare else ()
        for world_size in e.world_sizes:
            stopped: list[Leftover] = []
            with tempfile.TemporaryDirectory(prefix="ddp_tutorial_check_") as trace_dir, \
                    tempfile.TemporaryDirectory(prefix="ddp_tutorial_scratch_") as scratch:
                try:
                    reports = spawn(in_scratch, world_size, timeout=timeout, init_process_group=e.init_process_group,
                                    args=(e.worker, scratch, str(source), e.function, trace_dir, *extra),
                                    leftovers=stopped)
                except WorkerTimeout as err:
                    return fail(hang(e, err, world_size, timeout, trace_dir, source))
                except WorkerError as err:
                    if err.rank >= 0 and "NotImplementedError" in str(err).splitlines()[0]:
                        return CheckResult(e.name, False, e.still_raises(shown))
                    return fail(crash(err, world_size, source, trace_dir))
                finally:
                    left += [(world_size, s) for s in stopped]
            for rank, report in enumerate(reports):
                if report["problem"] is not None:
                    return fail(f"rank {rank} of a world of {world_size}, case {report['case']}: {report['problem']}")
            total += reports[0]["cases"]
    sizes = ", ".join(map(str, e.world_sizes))
    return CheckResult(e.name, True, f"exercise {e.number} ({e.name}), {shown}: all {total} cases right on world "
                                     f"sizes {sizes}. Well done!")


def stopped_note(left: list[tuple[int, Leftover]]) -> str:
    """One sentence: which processes the learner's code left running, so that the check stopped them."""
    named = [f"pid {s.pid}{f' `{s.command}`' if s.command else ''}, started by rank {s.rank} of a world of {size}"
             for size, s in left[:3]]
    more = f" and {len(left) - 3} more" if len(left) > 3 else ""
    count = f"{len(left)} process{'es' * (len(left) > 1)}"
    return (f"Also, the check stopped {count} your code left running ({'; '.join(named)}{more}): "
            "wait for what you start, or stop it, before your function returns.")


def hang(e: Exercise, err: WorkerTimeout, world_size: int, timeout: float, trace_dir: str, source: Path) -> str:
    """A timeout, explained: which ranks, in which case, blocked in which call, at which line of the learner's file."""
    ranks = err.ranks
    who = f"rank {ranks[0]} is" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))} are"
    case, _ = where_stuck(trace_dir, ranks[0])
    where, own_code = [], []
    for r in ranks:
        what = where_stuck(trace_dir, r)[1]
        line = stuck_at(trace_dir, r, source)
        at = f"{source.name}:{line[0]}" if line else ""
        if what:
            where.append(f"rank {r} is {what}{f' at {at}' if at and what.startswith('stuck in') else ''}")
        elif line:
            code = source.read_text(encoding="utf-8").splitlines()[line[0] - 1].strip()
            where.append(f"rank {r} was stuck at {at} `{code}`")
            own_code.append(line[1])
    details = f" ({'; '.join(where)})" if where else ""
    hint = e.hang_hint
    if own_code and all(own_code) and len(own_code) == len(where):  # no rank waiting on a peer: its own line
        hint = ("that line was running your own code, not waiting for another rank: a loop that never ends, or "
                "a call that blocks (a sleep, input(), a lock)")
    return (f"{who} still running after {timeout:g} s in a world of {world_size}"
            f"{f', case {case}' if case else ''}{details}: {hint}{'' if hint[-1] in '.?!' else '.'}")


def untouched(source: str, function: str) -> bool:
    """True when ``function`` in ``source`` is still the stub: a docstring, then ``raise NotImplementedError``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) else node.body
            return (len(body) == 1 and isinstance(body[0], ast.Raise) and isinstance(body[0].exc, ast.Call)
                    and getattr(body[0].exc.func, "id", "") == "NotImplementedError")
    return False


TRACEBACK_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n(?P<code>[^\n]*)')


def crash(err: WorkerError, world_size: int, source: Path, trace_dir: str) -> str:
    """An exception in a rank, with the line of the learner's file it came from; or a rank that died."""
    message = str(err).splitlines()[0].removeprefix(f"rank {err.rank} failed: ")
    case, stuck = where_stuck(trace_dir, err.rank) if err.rank >= 0 else ("", "")
    where = f"rank {err.rank} of a world of {world_size}{f', case {case}' if case else ''}"
    if "before returning a result" in message:  # killed: no Python exception to show
        code = re.search(r"code (-?\d+)", message)
        died = f"{where} died (exit code {code[1] if code else '?'})"
        call = stuck.removeprefix("stuck in ") if stuck.startswith("stuck in ") else ""
        last = call or last_call(trace_dir, err.rank)  # gloo may abort it between a call and its wait
        if "send" in last or "recv" in last:
            return (f"{died} {f'in {call}' if call else f'after {last}'}. On gloo a message larger than the receive buffer aborts the receiving "
                    "process (its output says \"Received data size doesn't match expected size\"): do "
                    "sender and receiver agree on which chunk travels, and on its size?")
        return f"{died}{f' in {call}' if call else ''}: its output above says why."
    frames = [m for m in TRACEBACK_LINE.finditer(err.remote_traceback) if Path(m["file"]) == source]
    at = f" at line {frames[-1]['line']} ({frames[-1]['code'].strip()})" if frames else ""
    return f"{where} raised {message}{at}."
