"""``python -m ddp_tutorial.exercises list | show NAME [--hint K] | check NAME [--solution | --file PATH] | reset NAME``.

Exit codes: 0 passed (or done), 1 the check failed (or the stub is untouched), 2 a usage error
(unknown name, no such file, no such hint).
"""

from __future__ import annotations

import argparse
import sys

from ddp_tutorial.exercises import reset, show, workspace
from ddp_tutorial.exercises.checker import DEFAULT_TIMEOUT, run_check
from ddp_tutorial.exercises.registry import NoSuchHint, UnknownExercise, listing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_tutorial.exercises",
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
    print(result)
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
