"""A comparison: which of its runs have finished, their table and plot — methods × α, mean ± std over seeds (the
layout of FedOPAL's Tables I–II) — and the command that builds them from what is on disk.

A config with ``variants:`` (methods) and ``sweep:`` (e.g. ``partition.alpha`` × ``seed``) runs every
combination (``fl_lightning.config.variants.expand_variants``); :func:`collect` splits its runs into the
finished and the not yet finished, and :func:`write_comparison` writes beside the run folders:

* ``comparison.csv`` — one row per (method, α): mean and sample standard deviation (ddof = 1; empty for
  a single run, which has no spread to show) of the final accuracy over the seeds, the number of runs,
  and the mean bytes uploaded per client and wall time;
* ``comparison.md`` — the same as a markdown table, methods as rows and α as columns, in percent, each
  cell with its number of runs (``85.00 ± 1.20 (n=3)``; one run: ``85.00 (n=1)``, no ±), and the runs
  not finished yet;
* ``comparison.png`` — accuracy against α per method (log-α axis, IID drawn at the right end);
* when every run has a simulated clock (a system model, e.g. FeDiSyn and its baselines), the
  time- and traffic-to-accuracy curves of :mod:`fl_lightning.experiments.curves` too.

Rows are a run's ``label`` (by default its variant's ``run_name``, or its algorithm); a run whose
config does not sweep α falls in the single column of its α.

``python -m fl_lightning.compare DIR`` (:func:`main`) builds these files in ``DIR`` — a comparison's
``output_dir`` — from whatever runs have finished, and names those that have not: the way to see a
comparison spread over jobs or GPUs (``--shard I/N``) while it runs, or once its last share is done.
``DIR/comparison.yaml`` (written when a comparison starts) says which runs there should be; a folder from
before it is read run by run (every ``DIR/*/`` with a ``summary.json``), with no list of missing runs.
Exit status: 0 when a table was written (missing runs are named on stderr, and in ``comparison.md``);
2 when ``DIR`` holds no finished run of the comparison, or no comparison at all, or the command line is
wrong (one line).
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_lightning.durable_write import atomic_path, write_text_atomic
from fl_lightning.experiments.command import CommandParser, run_command
from fl_lightning.experiments.figures import saved_figure
from fl_lightning.experiments.plan import COMPARISON_CONFIG, finished_summary

__all__ = ["BYTES_UP_COLUMN", "collect", "comparison_rows", "write_comparison", "write_table", "main"]

# summary.json's bytes_up_per_client: what one client uploaded over the whole run (every round), not per round
BYTES_UP_COLUMN = "bytes up / client, all rounds"

_PROG = "python -m fl_lightning.compare"


def collect(
    runs: Sequence[Any], known: dict[int, dict[str, Any]] | None = None
) -> tuple[list[tuple[Any, dict[str, Any]]], list[Any]]:
    """``(finished (config, summary) pairs, unfinished configs)`` of ``runs``, in their order; ``known`` maps
    a run's position to a summary already in hand (this process ran it)."""
    known = known or {}
    finished, missing = [], []
    for i, run in enumerate(runs):
        summary = known.get(i) or finished_summary(run)
        if summary is None:
            missing.append(run)
        else:
            finished.append((run, summary))
    return finished, missing


def _alpha_name(alpha: float) -> str:
    return "IID" if math.isinf(alpha) else f"{alpha:g}"


def comparison_rows(results: Sequence[tuple[Any, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Group (config, summary) pairs by (label, α); mean and sample std (ddof = 1) of the accuracy over the
    runs (the seeds); the std is None where fewer than two runs have an accuracy."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    order: list[str] = []
    for cfg, summary in results:
        label = cfg.label or cfg.algorithm
        if label not in order:
            order.append(label)
        groups[(label, float(cfg.partition.alpha))].append(summary)
    rows = []
    for (label, alpha), summaries in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        acc = [float(s["accuracy"]) for s in summaries if s.get("accuracy") is not None]
        rows.append(
            {
                "method": label,
                "alpha": alpha,
                "runs": len(summaries),
                "accuracy_mean": statistics.fmean(acc) if acc else float("nan"),
                "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else None,
                "bytes_up_per_client": statistics.fmean(float(s["bytes_up_per_client"]) for s in summaries),
                "wall_time_s": statistics.fmean(float(s["wall_time_s"]) for s in summaries),
            }
        )
    return rows


def _markdown(rows: list[dict[str, Any]], missing: Sequence[str] = ()) -> str:
    alphas = sorted({r["alpha"] for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["alpha"]): r for r in rows}
    head = "| method | " + " | ".join(f"α = {_alpha_name(a)}" for a in alphas) + f" | {BYTES_UP_COLUMN} |"
    lines = [head, "|" + " --- |" * (len(alphas) + 2)]
    for m in methods:
        cells = []
        for a in alphas:
            r = cell.get((m, a))
            cells.append("—" if r is None else _cell(r))
        up = statistics.fmean(r["bytes_up_per_client"] for r in rows if r["method"] == m)
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {up:,.0f} |")
    lines.append("")
    lines.append(
        "Top-1 accuracy (%), mean ± sample std (ddof = 1) over the n runs (seeds) of each cell; a cell of one run has no ±."
    )
    if missing:
        lines.append("")
        lines.append(f"Not finished yet ({len(missing)} run(s), not in the table): {', '.join(missing)}.")
    return "\n".join(lines) + "\n"


def _cell(row: dict[str, Any]) -> str:
    """``85.00 ± 1.20 (n=3)``; ``85.00 (n=1)`` for a single run (no spread to show)."""
    mean = f"{100 * row['accuracy_mean']:.2f}"
    spread = "" if row["accuracy_std"] is None else f" ± {100 * row['accuracy_std']:.2f}"
    return f"{mean}{spread} (n={row['runs']})"


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    finite = sorted({r["alpha"] for r in rows if not math.isinf(r["alpha"])})
    iid_x = max(finite) * 10 if finite else 1.0
    x_of = lambda a: iid_x if math.isinf(a) else a  # noqa: E731
    # format: path is a temp file, whose name does not say it
    with saved_figure(path, figsize=(6, 4), format="png") as ax:
        for method in dict.fromkeys(r["method"] for r in rows):
            pts = sorted(
                (x_of(r["alpha"]), r["accuracy_mean"], r["accuracy_std"] or 0.0)  # one run: no error bar
                for r in rows
                if r["method"] == method
            )
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, [100 * y for y in ys], yerr=[100 * e for e in es], marker="o", capsize=3, label=method)
        ax.set_xscale("log")
        ticks = finite + ([iid_x] if any(math.isinf(r["alpha"]) for r in rows) else [])
        ax.set_xticks(ticks, [_alpha_name(a) if a != iid_x else "IID" for a in ticks])
        ax.set_xlabel("Dirichlet α (label skew: small = skewed)")
        ax.set_ylabel("top-1 accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def write_comparison(
    results: Sequence[tuple[Any, dict[str, Any]]], out_dir: str | Path, *, missing: Sequence[str] = ()
) -> dict[str, Path]:
    """Write comparison.csv, comparison.md and comparison.png into ``out_dir``; return their paths.

    Each file is replaced whole (written aside, then renamed): the shares of a comparison (``--shard``) that
    finish together never leave a torn table. ``missing``: runs of the comparison not finished yet (named
    in comparison.md).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = comparison_rows(results)
    paths = {"csv": out / "comparison.csv", "md": out / "comparison.md", "png": out / "comparison.png"}
    with atomic_path(paths["csv"]) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_text_atomic(paths["md"], _markdown(rows, missing))
    with atomic_path(paths["png"]) as tmp:
        _plot(rows, tmp)
    if all("simulated_time_s" in summary for _, summary in results) or any(
        int(summary.get("rounds", 1)) > 1 for _, summary in results
    ):  # the clock's curves, or accuracy per round where a run has more than one
        from fl_lightning.experiments.curves import write_curves

        paths.update(write_curves([cfg.run_dir for cfg, _ in results], out))
    return paths


def write_table(finished: Sequence[tuple[Any, dict[str, Any]]], missing: Sequence[Any], out_dir: str | Path) -> dict[str, Path]:
    """Write the comparison of the finished runs into ``out_dir`` and say on stdout/stderr what is there."""
    paths = write_comparison(finished, out_dir, missing=[run.resolved_run_name for run in missing])
    print("comparison: " + ", ".join(str(p) for p in paths.values()))
    logged = [run for run, _ in finished if run.logging.wandb]
    if logged:  # the table and the plot, once per comparison, in a W&B run of its own
        from fl_lightning.callbacks.wandb_logging import log_comparison

        log_comparison(logged[0], comparison_rows(finished), paths["png"], Path(out_dir))
    if missing:
        names = ", ".join(run.resolved_run_name for run in missing)
        print(
            f"fl_lightning: the table holds {len(finished)} of {len(finished) + len(missing)} runs; not finished yet: {names}",
            file=sys.stderr,
        )
    return paths


def _runs_in(out_dir: Path) -> tuple[list[Any], bool]:
    """The comparison's runs (from its comparison.yaml, located in ``out_dir``), or those found in its folders;
    and whether the list is the comparison's own (so that runs not there are missing)."""
    from fl_lightning.config.loading import load_config
    from fl_lightning.config.variants import expand_variants

    config = out_dir / COMPARISON_CONFIG
    if config.is_file():
        return expand_variants(load_config(config, ["--output_dir", str(out_dir)])), True
    runs = []
    for folder in sorted(p for p in out_dir.iterdir() if (p / "summary.json").is_file()):
        if (folder / "config.yaml").is_file():
            runs.append(load_config(folder / "config.yaml", ["--output_dir", str(out_dir), "--run_name", folder.name]))
    return runs, False


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fl_lightning.compare DIR``."""
    return run_command(_compare, argv)


def _compare(argv: list[str]) -> int:
    from fl_lightning.errors import UsageError

    parser = CommandParser(
        _PROG,
        description="Build comparison.{csv,md,png} (and the time- and traffic-to-accuracy curves, where the "
        "runs have a simulated clock) in DIR from whatever runs of the comparison have finished, "
        f"and name those that have not. DIR/{COMPARISON_CONFIG} (written when a comparison starts) "
        "says which runs there should be; without it every DIR/*/ with a summary.json is read.",
        epilog="Exit status: 0 when a table was written (runs not finished yet are named on stderr and in "
        "comparison.md); 2 when DIR holds no finished run, or no comparison, or the command line is wrong "
        "(one line). See docs/usage.md.",
        example=f"{_PROG} runs/fedopal_table2_cifar10",
    )
    parser.add_argument(
        "dir", metavar="DIR", type=Path, help="a comparison's output_dir (as in its config, or the train command's --output_dir)"
    )
    out_dir = parser.parse_args(argv).dir
    if not out_dir.is_dir():
        raise UsageError(f"usage error: '{out_dir}' is not a folder; pass a comparison's output_dir")
    runs, listed = _runs_in(out_dir)
    finished, missing = collect(runs)
    if not finished:
        what = (
            f"none of its {len(runs)} runs has finished"
            if listed
            else f"no run folder with a summary.json, and no {COMPARISON_CONFIG}"
        )
        raise UsageError(f"usage error: '{out_dir}': {what}; nothing to tabulate yet")
    write_table(finished, missing, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
