"""``python -m ddp_tutorial.exercises list | show NAME [--hint K] | check NAME [--solution | --file PATH] | reset NAME``.

Exit codes: 0 passed (or done), 1 the check failed (or the stub is untouched), 2 a usage error
(unknown name, no such hint, a ``--file`` that is missing, a folder or not UTF-8 text, a
``--timeout`` that is not a positive number of seconds): one line, before any rank starts.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ddp_tutorial.exercises import reset, show, workspace
from ddp_tutorial.exercises.checker import DEFAULT_TIMEOUT, run_check
from ddp_tutorial.exercises.registry import NoSuchHint, UnknownExercise, listing
from ddp_tutorial.launch.errors import UsageParser


def source_problem(path: str) -> str | None:
    """Why the file ``--file`` names cannot be checked (missing, a folder, unreadable, not UTF-8), or None."""
    source = Path(path).expanduser()
    try:
        source.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return f"no file {path}"
    except IsADirectoryError:
        return f"{path} is a folder; give the Python file that defines the exercise's function"
    except UnicodeDecodeError as err:
        return (f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} at position {err.start}): "
                "save it as UTF-8, as Python expects")
    except OSError as err:
        return f"cannot read {path}: {err.strerror or err}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = UsageParser(prog="python -m ddp_tutorial.exercises",
                                     description="the course's exercises: list them, check one, start one again")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every exercise, lesson by lesson")
    show_cmd = commands.add_parser("show", help="an exercise's task, signature, hint and what is checked")
    show_cmd.add_argument("name")
    show_cmd.add_argument("--hint", type=int, metavar="K", help="hint K only: 1 the idea, the last the formulas")
    check_cmd = commands.add_parser("check", help="check your copy of an exercise (or --solution, or --file)")
    check_cmd.add_argument("name")
    source = check_cmd.add_mutually_exclusive_group()
    source.add_argument("--solution", action="store_true", help="check the reference solution")
    source.add_argument("--file", metavar="PATH", help="check any file that defines the exercise's function")
    check_cmd.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                           help=f"seconds per world size before a hang is reported (default {DEFAULT_TIMEOUT:g})")
    reset_cmd = commands.add_parser("reset", help="replace your copy of an exercise by its stub")
    reset_cmd.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "check":
        if not (math.isfinite(args.timeout) and args.timeout > 0):
            check_cmd.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
        problem = args.file is not None and source_problem(args.file)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        if args.command == "list":
            print(listing())
            print(f"\nyour copies: {workspace.shown(workspace.folder())}/  "
                  "check one: python -m ddp_tutorial.exercises check NAME")
            return 0
        if args.command == "show":
            show(args.name, hint=args.hint)
            return 0
        if args.command == "reset":
            reset(args.name)
            return 0
        result = run_check(args.name, file=args.file, solution=args.solution, timeout=args.timeout)
    except (UnknownExercise, NoSuchHint, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except UnicodeDecodeError:  # the learner's own copy, saved in another encoding
        print(f"error: your copy of {args.name} is not UTF-8 text: save it as UTF-8, as Python expects",
              file=sys.stderr)
        return 2
    print(result)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
