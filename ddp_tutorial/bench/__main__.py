"""Command line of the benchmarks: ``python -m ddp_tutorial.bench {launch,...,all} [--json] [--plot PATH]``.

Every option is checked before the first benchmark runs (``common.BenchParser``, ``common.output_problem``):
a zero count or an output path that cannot be written is one line and exit 2, not results lost at the end.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time

from ddp_tutorial.bench import SUBCOMMANDS, subcommand
from ddp_tutorial.bench.common import BenchParser, output_problem

OUTPUTS = ("json", "plot", "machine")  # the options that name a file to write


def build_parser() -> tuple[BenchParser, dict[str, BenchParser]]:
    """The parser, and each subcommand's (its own options, ``--json``, ``--plot``, ``--machine``) by name."""
    parser = BenchParser(prog="python -m ddp_tutorial.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS + ["all"]:
        module = None if name == "all" else subcommand(name)
        p = sub.add_parser(name, help=module.HELP if module else "every benchmark, one after another")
        p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
        p.add_argument("--plot", metavar="PATH", help="also save a matplotlib figure (PNG)")
        p.add_argument("--machine", metavar="PATH",
                       help="also write what the run ran on (CPUs, GPUs, versions, load average) as JSON")
        if module and hasattr(module, "add_arguments"):
            module.add_arguments(p)
    return parser, sub.choices


def main(argv: list[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    for option in OUTPUTS:
        path = getattr(args, option)
        problem = path is not None and not (option == "json" and path == "-") and output_problem(path)
        if problem:
            commands[args.command].error(f"--{option} {path}: cannot write it: {problem}")
    names = SUBCOMMANDS if args.command == "all" else [args.command]
    started, load_before = time.monotonic(), _loadavg()
    results, modules = [], []
    for name in names:
        module = subcommand(name)
        if args.command == "all":  # defaults of each subcommand's own options
            sub_args = commands[name].parse_args([])
        else:
            sub_args = args
        result = module.run(sub_args)
        print(result, flush=True)
        print()
        results.append(result)
        modules.append(module)
    if args.json:
        text = json.dumps([r.to_dict() for r in results], indent=2, allow_nan=False)  # strict JSON
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.machine:
        with open(args.machine, "w") as f:
            json.dump(_machine(argv, load_before, time.monotonic() - started), f, indent=2)
            f.write("\n")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        drawable = [(m, r) for m, r in zip(modules, results) if hasattr(m, "plot")]
        if drawable:
            fig, axes = plt.subplots(1, len(drawable), figsize=(5 * len(drawable), 4), squeeze=False)
            for ax, (module, result) in zip(axes[0], drawable):
                module.plot(result, ax)
            fig.tight_layout()
            fig.savefig(args.plot, dpi=100)
            print(f"figure saved to {args.plot}")
    return 0


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not on every platform
        return "unknown"


def _machine(argv: list[str] | None, load_before: str, seconds: float) -> dict:
    """What the numbers depend on: saved next to a run so that readers can judge them (``13_performance``)."""
    from ddp_tutorial.doctor import devices, versions

    found, hardware = versions(), devices()
    return {"command": "python -m ddp_tutorial.bench " + shlex.join(sys.argv[1:] if argv is None else argv),
            "cpus": hardware["cpu cores"], "torch": found["torch"], "python": found["python"],
            "machine": platform.machine(), "cuda_devices": hardware["cuda devices"],
            "loadavg_before": load_before, "loadavg_after": _loadavg(), "seconds": round(seconds)}


if __name__ == "__main__":
    sys.exit(main())
