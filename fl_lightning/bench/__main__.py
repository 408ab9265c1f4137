"""``python -m fl_lightning.bench [fedopal|fedisyn|all] [--quick] [--out FILE.json]``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# Nothing here downloads (random weights, tiny diffusion parts); make sure no library tries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fl_lightning.bench import BENCHMARKS, results_table, run_benchmarks  # noqa: E402

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the benchmarks, print the table, write the JSON; returns 0."""
    parser = argparse.ArgumentParser(
        prog="python -m fl_lightning.bench",
        description="FedOPAL / FeDiSyn performance figures as ratios to same-run baselines.",
    )
    parser.add_argument("which", nargs="?", default="all", choices=(*BENCHMARKS, "all"),
                        help="which suite to run (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, seconds: checks the machinery, not the thresholds")
    parser.add_argument("--out", type=Path, default=None, help="write all numbers to this JSON file")
    args = parser.parse_args(argv)

    from rich.console import Console

    names = list(BENCHMARKS) if args.which == "all" else [args.which]
    progress = Console(stderr=True)
    results = run_benchmarks(names, quick=args.quick,
                             on_suite_start=lambda name: progress.print(f"running {name} benchmarks ..."))
    console = Console()
    if not console.is_terminal:  # piped or captured: do not fold the table to 80 columns
        console = Console(width=150)
    console.print(results_table(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
