"""Accuracy per round, and time- and traffic-to-accuracy curves of a comparison (the layout of FeDiSyn's Figs. 8–11).

Every run writes one row per round to ``metrics.csv`` (``round``, ``accuracy``, ``bytes_up``): its curve is accuracy
against the round (``curves_rounds.png``). Every FeDiSyn-family run (FeDiSyn, its ablations, SFLF, CAFF, GPT-FL,
FGL) writes to ``metrics.csv`` also the simulated clock ``simulated_time_s`` (H_gene + H_pre + Σ H^t) and the bytes
uploaded so far ``bytes_up``. :func:`write_curves` reads those files beside the runs and writes:

* ``curves.csv`` — method, round, simulated time (s; empty without a system model), uploaded traffic (MB),
  accuracy, best accuracy so far;
* ``time_to_accuracy.csv`` — per method and target accuracy: the first round, simulated time and traffic at
  which the best-so-far accuracy reaches the target (empty when it never does);
* ``curves_rounds.png`` — accuracy against the round, one line per method (every comparison of several rounds);
* ``curves_time.png`` / ``curves_traffic.png`` — best-so-far accuracy against simulated time and against
  uploaded traffic, one line per method (when every run has the simulated clock).

Traffic is what the devices upload in fine-tuning — what the paper's traffic figures count (7.4 MB for
FeDiSyn vs 262.1 MB for CAFF on non-IID Food-101 cannot hold FeDiSyn's ~0.3 GB of fp32 latents; see
``systems/calibration.py``): the ``bytes_up_finetune`` column where a run has it. The synthesis-phase
upload (latents, captions, counts; ``bytes_up_synthesis``) is a column of ``curves.csv`` of its own, and
it is on the simulated clock either way. A method's label is the run's
``label`` (the comparison's row name) or, failing that, its algorithm.

Command line::

    python -m fl_lightning.curves RUN_DIR [RUN_DIR ...] --out DIR [--targets 0.5 0.7]
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from fl_lightning.errors import UsageError
from fl_lightning.experiments.command import CommandParser, run_command
from fl_lightning.experiments.figures import saved_figure
from fl_lightning.federation.storage.run_folder import read_metrics_csv

__all__ = ["Curve", "read_curve", "first_reaching", "first_round_reaching", "write_curves", "main"]

_MB = 1e6


@dataclass
class Curve:
    """One run's per-round series."""

    label: str
    rounds: list[int]
    time_s: list[float] | None  # the simulated clock (None: the method has no system model)
    traffic_mb: list[float]
    accuracy: list[float]
    synthesis_mb: list[float] | None = None  # the synthesis-phase upload so far (None: the run has no such column)

    @property
    def best(self) -> list[float]:
        """Best accuracy so far (what a deployment would keep), per round."""
        out, best = [], -math.inf
        for a in self.accuracy:
            best = max(best, a)
            out.append(best)
        return out


def read_curve(run_dir: str | Path) -> Curve:
    """A run's curve from its ``metrics.csv`` (``simulated_time_s`` where the method has a system model) and its
    label from ``config.yaml``."""
    run = Path(run_dir)
    metrics = run / "metrics.csv"
    if not metrics.is_file():
        raise UsageError(f"no metrics.csv in {run} (is it a run folder?)")
    rows = read_metrics_csv(metrics)
    if not rows or "accuracy" not in rows[0]:
        raise UsageError(f"{metrics} has no rounds with an accuracy (has the run finished a round?)")
    label = None
    if (run / "config.yaml").is_file():
        config = yaml.safe_load((run / "config.yaml").read_text()) or {}
        label = config.get("label") or config.get("algorithm")
    if label is None and (run / "summary.json").is_file():
        label = json.loads((run / "summary.json").read_text()).get("algorithm")
    return Curve(
        label=str(label or run.name),
        rounds=[int(r["round"]) for r in rows],
        time_s=[float(r["simulated_time_s"]) for r in rows] if "simulated_time_s" in rows[0] else None,
        traffic_mb=[float(r.get("bytes_up_finetune", r["bytes_up"])) / _MB for r in rows],
        accuracy=[float(r["accuracy"]) for r in rows],
        synthesis_mb=[float(r["bytes_up_synthesis"]) / _MB for r in rows] if "bytes_up_synthesis" in rows[0] else None,
    )


def first_round_reaching(curve: Curve, target: float) -> int | None:
    """The first round whose best-so-far accuracy is ≥ ``target``; None if never."""
    return next((r for r, best in zip(curve.rounds, curve.best) if best >= target), None)


def first_reaching(curve: Curve, target: float) -> tuple[float, float] | None:
    """(simulated time, traffic in MB) of the first round whose best-so-far accuracy is ≥ ``target``; None if never
    (or without the simulated clock)."""
    for t, mb, best in zip(curve.time_s or [], curve.traffic_mb, curve.best):
        if best >= target:
            return t, mb
    return None


def _plot(curves: Sequence[Curve], x: str, path: Path, xlabel: str) -> None:
    with saved_figure(path, figsize=(5.5, 3.8)) as ax:
        for c in curves:
            if x == "rounds":  # the accuracy each round reached
                ax.plot(c.rounds, [100 * a for a in c.accuracy], marker="o", ms=3, label=c.label)
            else:
                ax.step(getattr(c, x), [100 * b for b in c.best], where="post", marker="o", ms=3, label=c.label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)" if x == "rounds" else "test accuracy, best so far (%)")
        if x == "traffic_mb" and all(v > 0 for c in curves for v in c.traffic_mb):
            ax.set_xscale("log")  # traffic spans orders of magnitude (LoRA blocks vs whole models)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def write_curves(run_dirs: Sequence[str | Path], out_dir: str | Path, targets: Sequence[float] | None = None) -> dict[str, Path]:
    """Write the curves' CSVs and plots for ``run_dirs`` into ``out_dir``; returns the paths by name.

    Args:
        run_dirs: run folders (each with metrics.csv and config.yaml).
        out_dir: where to write (created).
        targets: accuracies for ``time_to_accuracy.csv``; default: 50 %, 75 % and 90 % of the best
            final accuracy among the runs (tiny runs reach no absolute target worth reading).
    """
    curves = [read_curve(r) for r in run_dirs]
    if not curves:
        raise UsageError("no run folders given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if targets is None:
        top = max(max(c.best) for c in curves)
        targets = [round(top * q, 4) for q in (0.5, 0.75, 0.9)]
    clocked = all(c.time_s is not None for c in curves)
    paths = {"curves": out / "curves.csv", "time_to_accuracy": out / "time_to_accuracy.csv"}
    paths["rounds_plot"] = out / "curves_rounds.png"
    if clocked:
        paths.update(time_plot=out / "curves_time.png", traffic_plot=out / "curves_traffic.png")
    with paths["curves"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "round", "simulated_time_s", "traffic_up_mb", "accuracy", "best_accuracy", "synthesis_up_mb"])
        for c in curves:
            synthesis, times = c.synthesis_mb or [""] * len(c.rounds), c.time_s or [""] * len(c.rounds)
            for row in zip(c.rounds, times, c.traffic_mb, c.accuracy, c.best, synthesis):
                w.writerow([c.label, *row])
    with paths["time_to_accuracy"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "target_accuracy", "round", "simulated_time_s", "traffic_up_mb"])
        for c in curves:
            for target in targets:
                reached, hit = first_round_reaching(c, target), first_reaching(c, target)
                w.writerow([c.label, target, "" if reached is None else reached, *(hit if hit else ("", ""))])
    _plot(curves, "rounds", paths["rounds_plot"], "round")
    if clocked:
        _plot(curves, "time_s", paths["time_plot"], "simulated time (s)")
        _plot(curves, "traffic_mb", paths["traffic_plot"], "fine-tuning uploads (MB)")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fl_lightning.curves RUN_DIR [RUN_DIR ...] --out DIR [--targets ...]``."""
    return run_command(_curves, argv)


def _curves(argv: list[str]) -> int:
    parser = CommandParser(
        "python -m fl_lightning.curves",
        description="Accuracy per round, and time- and traffic-to-accuracy curves (CSV + PNG), from run folders.",
        example="python -m fl_lightning.curves runs/compare_tiny/* --out runs/compare_tiny --targets 0.5 0.7",
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (with metrics.csv)")
    parser.add_argument("--out", type=Path, required=True, help="folder for curves.csv, time_to_accuracy.csv, PNGs")
    parser.add_argument("--targets", type=float, nargs="*", default=None, help="target accuracies in [0, 1]")
    args = parser.parse_args(argv)
    paths = write_curves(args.runs, args.out, args.targets)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
