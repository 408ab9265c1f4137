"""``python -m benchmarks [fedopal|fedisyn|scale|engine|features|ranks|gpu_check|loader|all] [--quick] [--out FILE.json]``.

``all`` runs the method suites (fedopal, fedisyn); ``scale`` (the engine from 10 to 10,000 clients)
runs by name: ``--clients 10,100``, ``--processes 1`` and ``--engine-only`` narrow it. ``engine`` (a
30-round FedAvg against a bare loop) runs by name too: ``--threads 1,2``, ``--model large`` and
``--clients 1000`` choose the point, ``--repeats`` how many fresh runs of each side (best taken).
``features`` (a comparison of AFL, FedCGS and FedPFT against one AFL run, on the DINOv2 ViT-S/14
checkpoint) runs by name. ``ranks`` (a tiny FeDiSyn, DENSE and FedAvg on 1, 2 and 4 CPU processes: wall time and
each rank's share of time waiting in collectives) runs by name; ``--processes`` chooses the counts, ``--methods``
the methods (``gptfl,gptfl_records``: GPT-FL's whole-model uploads folded on the ranks against a record per client). ``gpu_check``
(scripts/gpu_check.sh's checks: ViT-B/16 bf16 throughput, 1 = 2 GPUs, 16-mixed learns) runs by name. ``loader`` (the
data path alone: images/s of the paper configs' CLIP 224-px pipeline per worker count, float32 vs the uint8 cache,
against what a ViT-B/16 or ViT-L/16 bf16 step needs on an H100) runs by name."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

# Nothing here downloads (random weights, tiny diffusion parts); make sure no library tries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks import BENCHMARKS, ENGINE_BENCHMARKS, results_table, run_benchmarks  # noqa: E402

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the benchmarks, print the table, write the JSON; returns 0 (2: a missing resource)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="FedOPAL / FeDiSyn performance figures as ratios to same-run baselines.",
    )
    parser.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=(*BENCHMARKS, *ENGINE_BENCHMARKS, "all"),
        help="which suite to run (default: all = the method suites; scale runs by name)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny models, seconds: checks the machinery, not the thresholds")
    parser.add_argument("--out", type=Path, default=None, help="write all numbers to this JSON file")
    parser.add_argument(
        "--clients",
        type=_int_list,
        default=None,
        help="scale: the numbers of clients K, e.g. 10,100 (default 10,100,1000,10000; quick 10,100); "
        "engine: K (default 50; 10 a round)",
    )
    parser.add_argument(
        "--processes",
        type=_int_list,
        default=None,
        help="scale: run the framework with these numbers of processes (default 1,2); ranks: the process counts (default 1,2,4)",
    )
    parser.add_argument(
        "--engine-only", action="store_true", help="scale: skip the peer job and the start-up timing (the engine's figures only)"
    )
    parser.add_argument(
        "--threads", type=_int_list, default=[1, 2], help="engine: torch threads of both jobs, one point per value (default 1,2)"
    )
    parser.add_argument(
        "--model",
        choices=("small", "large"),
        default="small",
        help="engine: the 327 k-parameter ResNet (small, default) or a 2.8 M one (large)",
    )
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="engine: fresh runs of each job, bare and framework alternating (best taken; default 3)",
    )
    parser.add_argument(
        "--model-from",
        type=Path,
        default=None,
        help="ranks: print the per-phase model's estimate for 1, 2, 4, 8 ranks from this JSON of one GPU's phase times "
        "(e.g. benchmarks/data/fedisyn_food101_h100.json) and run nothing",
    )
    parser.add_argument(
        "--methods",
        type=lambda text: [m for m in text.split(",") if m],
        default=None,
        help="ranks: the methods, comma-separated (default fedisyn,dense,fedavg; also gptfl and gptfl_records: GPT-FL's "
        "uploads folded on the ranks, and through a record per client)",
    )
    args = parser.parse_args(argv)
    options = {
        "scale": {"clients": args.clients, "processes": args.processes or [1, 2], "extras": not args.engine_only},
        "ranks": {
            "processes": args.processes or [1, 2, 4],
            "model_from": args.model_from,
            **({"methods": args.methods} if args.methods else {}),
        },
        "engine": {
            "threads": args.threads,
            "model": args.model,
            "clients": args.clients[0] if args.clients else 50,
            "repeats": args.repeats,
        },
    }

    from rich.console import Console

    names = list(BENCHMARKS) if args.which == "all" else [args.which]
    progress = Console(stderr=True)
    from fl_lightning.errors import UsageError

    try:
        results = run_benchmarks(
            names, quick=args.quick, options=options, on_suite_start=lambda name: progress.print(f"running {name} benchmarks ...")
        )
    except UsageError as err:  # a missing resource (the features suite's checkpoint): one line, exit 2
        print(f"benchmarks: {err}", file=sys.stderr)
        return 2
    console = Console()
    if not console.is_terminal:  # piped or captured: do not fold the table to 80 columns
        console = Console(width=150)
    console.print(results_table(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {args.out}")
    return 0


def _positive_int(text: str) -> int:
    values = _int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer >= 1, got {text!r}")
    return values[0]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


if __name__ == "__main__":
    sys.exit(main())
