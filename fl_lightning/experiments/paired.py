"""Paired differences in a comparison: a method minus a reference on the very same cells.

A comparison (``variants:`` × ``sweep:``) runs every method on the same partitions: the runs of two
methods with the same α, ``seed`` and ``partition.seed`` share their data, split and partition, so their
difference in accuracy is free of the spread between partitions that the mean ± std of
``comparison.md`` carries. ``python -m fl_lightning.paired DIR METHOD REFERENCE`` (labels as in
``comparison.md``: a run's ``label``, else its algorithm) writes ``DIR/paired.md`` and prints it: one
cell per (α, seed) with METHOD − REFERENCE in accuracy points, and per α and overall the worst and the
mean difference, over the finished pairs (an unfinished run leaves its cell empty, "—").

Exit status: 0 when a table was written; 2 (one line) when DIR holds no comparison, or no finished pair
of the two labels.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["paired_differences", "paired_markdown", "main"]


def _alpha_name(alpha: float) -> str:
    return "IID" if math.isinf(alpha) else f"{alpha:g}"


def paired_differences(results: Sequence[tuple[Any, dict[str, Any]]], *, method: str, reference: str) -> list[dict[str, Any]]:
    """Pair the finished runs of ``method`` and ``reference`` on (α, seed, partition seed).

    Args:
        results: (config, summary) pairs, e.g. from :func:`fl_lightning.experiments.comparison.collect`.
        method, reference: labels (a config's ``label``, else its ``algorithm``).

    Returns:
        One dict per pair, sorted by (α, seed, partition seed): ``alpha``, ``seed``, ``partition_seed``,
        ``method``, ``reference`` (accuracies in [0, 1]) and ``difference`` = method − reference.
    """
    runs: dict[str, dict[tuple[float, int, int], float]] = {method: {}, reference: {}}
    for cfg, summary in results:
        label = cfg.label or cfg.algorithm
        if label in runs and summary.get("accuracy") is not None:
            key = (float(cfg.partition.alpha), int(cfg.seed), int(cfg.partition.seed))
            if key in runs[label]:
                raise ValueError(f"two runs of {label!r} on the same cell (α, seed, partition seed) = {key}")
            runs[label][key] = float(summary["accuracy"])
    return [
        {
            "alpha": k[0],
            "seed": k[1],
            "partition_seed": k[2],
            "method": runs[method][k],
            "reference": runs[reference][k],
            "difference": runs[method][k] - runs[reference][k],
        }
        for k in sorted(set(runs[method]) & set(runs[reference]))
    ]


def paired_markdown(rows: Sequence[dict[str, Any]], *, method: str, reference: str) -> str:
    """The pairs as a table (seeds × α, points), with the worst and the mean difference per α and overall."""
    if not rows:
        raise ValueError("no pairs to tabulate")
    alphas = sorted({r["alpha"] for r in rows})
    seeds = sorted({(r["seed"], r["partition_seed"]) for r in rows})
    cell = {(r["alpha"], (r["seed"], r["partition_seed"])): 100 * r["difference"] for r in rows}
    lines = [
        f"{method} − {reference}, accuracy points, on the same partition (seed s: training seed, partition seed p)",
        "",
        "| seed (s, p) | " + " | ".join(f"α = {_alpha_name(a)}" for a in alphas) + " |",
        "|" + " --- |" * (len(alphas) + 1),
    ]
    for s in seeds:
        cells = [f"{cell[(a, s)]:+.2f}" if (a, s) in cell else "—" for a in alphas]
        lines.append(f"| {s[0]}, {s[1]} | " + " | ".join(cells) + " |")
    for name, fn in (("worst", min), ("mean", statistics.fmean)):
        per_alpha = [fn([v for (a, _), v in cell.items() if a == alpha]) for alpha in alphas]
        lines.append(f"| **{name}** | " + " | ".join(f"{v:+.2f}" for v in per_alpha) + " |")
    values = list(cell.values())
    lines += [
        "",
        f"Over all {len(values)} pairs: worst {min(values):+.2f}, mean {statistics.fmean(values):+.2f}, "
        f"{sum(v < 0 for v in values)} below 0, {sum(v == 0 for v in values)} equal.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fl_lightning.paired DIR METHOD REFERENCE``."""
    from fl_lightning.experiments.command import run_command

    return run_command(_paired, argv)


def _paired(argv: list[str]) -> int:
    from fl_lightning.config.loading import load_config
    from fl_lightning.errors import UsageError
    from fl_lightning.experiments.command import CommandParser
    from fl_lightning.experiments.comparison import collect
    from fl_lightning.experiments.plan import COMPARISON_CONFIG, plan_runs

    prog = "python -m fl_lightning.paired"
    parser = CommandParser(
        prog,
        description="Write DIR/paired.md and print it: METHOD − REFERENCE in accuracy points on the very same "
        "cells of a comparison (α, seed, partition seed: the same data, split and partition), one "
        "cell per (α, seed), with the worst and the mean difference per α and overall, over the "
        "finished pairs (an unfinished run leaves its cell empty).",
        epilog="Exit status: 0 when a table was written; 2 when DIR holds no comparison, or no finished pair of the "
        "two labels, or the command line is wrong (one line). See docs/usage.md.",
        example=f"{prog} runs/fedopal_plus_vs_afl_dinov2_digits FedOPAL+ AFL",
    )
    parser.add_argument("dir", metavar="DIR", type=Path, help=f"a comparison's output_dir (with its {COMPARISON_CONFIG})")
    parser.add_argument(
        "method", metavar="METHOD", help="the method's label as in comparison.md (a run's label, else its algorithm)"
    )
    parser.add_argument("reference", metavar="REFERENCE", help="the label it is compared with, subtracted")
    args = parser.parse_args(argv)
    out_dir, method, reference = args.dir, args.method, args.reference
    if not (out_dir / COMPARISON_CONFIG).is_file():
        what = f"holds no {COMPARISON_CONFIG}" if out_dir.is_dir() else "is not a folder"
        raise UsageError(f"usage error: '{out_dir}' {what}; pass a comparison's output_dir")
    runs = plan_runs(load_config(out_dir / COMPARISON_CONFIG, ["--output_dir", str(out_dir)]))
    finished, _ = collect(runs)
    rows = paired_differences(finished, method=method, reference=reference)
    if not rows:
        labels = sorted({r.label or r.algorithm for r in runs})
        raise UsageError(
            f"usage error: '{out_dir}': no finished pair of {method!r} and {reference!r} (its labels: {', '.join(labels)})"
        )
    text = paired_markdown(rows, method=method, reference=reference)
    (out_dir / "paired.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
