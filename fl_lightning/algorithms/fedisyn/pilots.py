"""Pilot runs for FeDiSyn's scaling law: run a config at a few small λ, read (λ, Acc, H) back, fit κ.

The scaling law (``fl_lightning.systems.scaling_law``) is calibrated on cheap pilot runs: each
pilot is a full FeDiSyn run at one λ; every round of it is an observation "accuracy Acc was
reached after H simulated seconds" (Acc the best accuracy so far, H the simulated clock,
H_gene + H_pre + Σ H^t). ``notebooks/fedisyn_scaling_law.ipynb`` drives these functions and plots.

Command line (fit pilots already reduced to a CSV with the columns ``lambda,accuracy,time_s``)::

    python -m fl_lightning.algorithms.fedisyn.pilots --pilots pilots.csv --target-accuracy 0.8 \\
        --h0 12.5 [--plot out.png]

It prints κ1..κ4 and λ*; the math is ``fl_lightning.systems.scaling_law`` (pure).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_lightning.config import load_config
from fl_lightning.errors import UsageError
from fl_lightning.federation.run_folder import read_metrics_csv
from fl_lightning.systems.scaling_law import (
    ScalingLawParams,
    fit_scaling_law,
    optimal_lambda,
    synthesis_cost_per_unit_lambda,
    total_time,
)

__all__ = ["PilotPoints", "Calibration", "run_pilots", "run_pilot_processes", "pilot_points", "calibrate",
           "auto_lambda", "main"]


@dataclass
class PilotPoints:
    """Observations (λ, Acc, H) of the pilot runs, one per round, and h0 of the runs' config."""

    lam: np.ndarray
    acc: np.ndarray
    time_s: np.ndarray
    h0: float


@dataclass
class Calibration:
    params: ScalingLawParams
    target_accuracy: float
    lam_star: float | None  # None when the fit has no interior minimum (κ2 ≤ 0 or κ1 ≤ 0)
    h0: float = math.nan  # the pilots' synthesis cost per unit λ, (ĥ + h̃ T̂) D


def run_pilots(config: str | Path, lambdas: Sequence[float], *, output_dir: str | Path,
               overrides: Sequence[str] = ()) -> list[Path]:
    """Run ``config`` once per λ (in this process, W&B off); returns the run folders."""
    from fl_lightning.federation.simulation import Simulation

    runs = []
    for lam in lambdas:
        cfg = load_config(config, [*overrides, "--output_dir", str(output_dir), "--run_name", f"pilot_lam{lam:g}",
                                   "--fedisyn.synthetic_lambda", repr(float(lam)), "--logging.wandb", "false"])
        Simulation(cfg=cfg, loggers=[]).run()
        runs.append(cfg.run_dir)
    return runs


def pilot_points(run_dirs: Sequence[str | Path], *, pretrain_epochs: int | None = None) -> PilotPoints:
    """Every round of every pilot as (λ, best accuracy so far, simulated time); h0 from the first run.

    h0 = (ĥ + h̃ T̂) D with ĥ, h̃ as the run charged them: H_gene / images and H_pre / (images · T̂).

    Args:
        pretrain_epochs: T̂ of the pilots (None: read from the first pilot's ``config.yaml``).
    """
    lam, acc, time_s, h0 = [], [], [], math.nan
    for run in map(Path, run_dirs):
        summary = json.loads((run / "summary.json").read_text())
        best = 0.0
        for row in read_metrics_csv(run / "metrics.csv"):
            best = max(best, float(row["accuracy"]))
            lam.append(summary["lambda"])
            acc.append(best)
            time_s.append(float(row["simulated_time_s"]))
        if math.isnan(h0):
            epochs = pretrain_epochs if pretrain_epochs is not None else load_config(run / "config.yaml").method.pretrain_epochs
            images, D = summary["synthetic_images"], summary["real_samples"]
            h_gen = summary["simulated_generation_s"] / images
            h_pre = summary["simulated_pretraining_s"] / (images * epochs)
            h0 = synthesis_cost_per_unit_lambda(h_gen, h_pre, epochs, D)
    return PilotPoints(np.array(lam), np.array(acc), np.array(time_s), float(h0))


def calibrate(points: PilotPoints, target_accuracy: float) -> Calibration:
    """κ1..κ4 by Levenberg–Marquardt on the pilots, and λ* at ``target_accuracy`` when it exists."""
    params = fit_scaling_law(points.lam, points.acc, points.time_s, h0=points.h0)
    ok = params.kappa1 > 0 and params.kappa2 > 0 and points.h0 > 0
    lam_star = optimal_lambda(target_accuracy, h0=points.h0, params=params) if ok else None
    return Calibration(params, float(target_accuracy), lam_star, float(points.h0))


def auto_lambda(points: PilotPoints, target_accuracy: float) -> Calibration:
    """``synthetic_lambda: auto``: fit Eq. (13) to the pilots and return the fit with its minimiser λ*.

    Raises:
        ValueError: the pilots cannot be fitted, or the fit has no finite interior minimum (κ1 ≤ 0, κ2 ≤ 0,
            h0 = 0, or λ* beyond float range).
    """
    try:
        cal = calibrate(points, target_accuracy)
    except OverflowError:  # e^{κ3 Acc} or λ* beyond float range: the pilots do not pin the law down
        raise ValueError("the pilots' fit puts λ* beyond float range: run pilots that reach different accuracies, "
                         "or give synthetic_lambda as a number") from None
    if cal.lam_star is None or not (math.isfinite(cal.lam_star) and cal.lam_star > 0):
        p = cal.params
        raise ValueError(f"the pilots' fit has no minimum in λ (κ1={p.kappa1:.3g}, κ2={p.kappa2:.3g}, h0={points.h0:.3g}): "
                         "run pilots that reach different accuracies, or give synthetic_lambda as a number")
    return cal


def run_pilot_processes(run_dir: Path, section: str, lambdas: Sequence[float], *, rounds: int,
                        timeout_s: float | None = None, cuda_device: int | None = None) -> list[Path]:
    """The pilots of ``synthetic_lambda: auto``: the run's own ``config.yaml`` at each pilot λ, for ``rounds``
    fine-tuning rounds, each in a fresh single-process ``python -m fl_lightning.train`` (one device, one node: a
    pilot never shares the ranks of the run that asked for it), into ``<run_dir>/pilots/pilot_lam<λ>/``.

    A pilot gets this process's environment without what a launcher set for its ranks
    (:func:`~fl_lightning.federation.launch.clean_launcher_env`): started from a rank of torchrun, ``fabric run``
    or srun, it would otherwise take itself for one of that launcher's processes (and stop: the launcher's
    world size is not its ``--federation.devices 1``).

    Args:
        cuda_device: the CUDA device this rank computes on (None off CUDA): each pilot sees that device only.

    Raises:
        RuntimeError: a pilot failed (its last stderr line is in the message).
    """
    import os
    import subprocess

    from fl_lightning.federation.launch import clean_launcher_env

    env = clean_launcher_env(os.environ, cuda_device=cuda_device)
    out, runs = Path(run_dir) / "pilots", []
    for lam in lambdas:
        name = f"pilot_lam{lam:g}"
        argv = [sys.executable, "-m", "fl_lightning.train", "--config", str(Path(run_dir) / "config.yaml"),
                "--output_dir", str(out), "--run_name", name, f"--{section}.synthetic_lambda", repr(float(lam)),
                "--federation.rounds", str(int(rounds)), "--federation.devices", "1", "--federation.num_nodes", "1",
                "--logging.wandb", "false"]
        if (out / name / "summary.json").is_file():  # a resumed run keeps its finished pilots
            runs.append(out / name)
            continue
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"pilot at λ={lam:g} failed: {last}")
        runs.append(out / name)
    return runs


# --- command line -------------------------------------------------------------------------------------

def _read_pilots(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not path.is_file():
        raise UsageError(f"pilot file not found: {path} "
                         "(give a CSV with columns lambda,accuracy,time_s)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"lambda", "accuracy", "time_s"} - set(reader.fieldnames or [])
        if missing:
            raise UsageError(f"{path}: missing column(s) {sorted(missing)}; "
                             "expected the header lambda,accuracy,time_s")
        try:
            rows = [(float(r["lambda"]), float(r["accuracy"]), float(r["time_s"]))
                    for r in reader]
        except (TypeError, ValueError) as err:
            raise UsageError(f"{path}: a value is not a number ({err})") from None
    if not rows:
        raise UsageError(f"{path}: no pilot rows under the header lambda,accuracy,time_s")
    lam, acc, t = (np.array(col) for col in zip(*rows))
    return lam, acc, t


def _plot(path: Path, lam: np.ndarray, observed: np.ndarray, *, acc: float, h0: float,
          params: ScalingLawParams, lam_star: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo = min(float(lam.min()), lam_star) / 2
    hi = max(float(lam.max()), lam_star) * 2
    grid = np.geomspace(lo, hi, 400)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(grid, total_time(grid, acc, h0=h0, params=params), label=f"H(λ, Acc={acc:g})")
    ax.scatter(lam, observed, color="k", zorder=3, label="pilot runs (own accuracy)")
    ax.axvline(lam_star, color="r", ls="--", label=f"λ* = {lam_star:.3g}")
    ax.set_xscale("log")
    ax.set_xlabel("λ (synthetic images / real samples)")
    ax.set_ylabel("total time H (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as one UsageError line instead of usage + exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see --help)")


def main(argv: Sequence[str] | None = None) -> int:
    """Fit the scaling law to pilot runs, print κ1..κ4 and λ*, optionally plot H(λ)."""
    parser = _Parser(
        prog="python -m fl_lightning.algorithms.fedisyn.pilots",
        description="Fit FeDiSyn's synthetic-data scaling law and print the optimal λ.")
    parser.add_argument("--pilots", type=Path, required=True,
                        help="CSV with columns lambda,accuracy,time_s (>= 4 rows)")
    parser.add_argument("--target-accuracy", type=float, required=True,
                        help="accuracy the federation must reach")
    parser.add_argument("--h0", type=float, required=True,
                        help="synthesis + pre-training seconds per unit λ, (ĥ + h̃ T̂) D")
    parser.add_argument("--plot", type=Path, default=None, help="save H against λ to this PNG")
    try:
        args = parser.parse_args(argv)
        if not math.isfinite(args.target_accuracy):
            raise UsageError(f"--target-accuracy must be a finite float, got {args.target_accuracy!r}")
        lam, acc, observed = _read_pilots(args.pilots)
        params = fit_scaling_law(lam, acc, observed, h0=args.h0)
        lam_star = optimal_lambda(args.target_accuracy, h0=args.h0, params=params)
    except (UsageError, ValueError) as err:  # bad command line or pilots the law cannot fit
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"kappa1={params.kappa1:.6g} kappa2={params.kappa2:.6g} "
          f"kappa3={params.kappa3:.6g} kappa4={params.kappa4:.6g}")
    h_star = float(total_time(lam_star, args.target_accuracy, h0=args.h0, params=params))
    print(f"lambda*={lam_star:.6g} (H={h_star:.6g} s at accuracy {args.target_accuracy:g})")
    if args.plot is not None:
        try:
            _plot(args.plot, lam, observed, acc=args.target_accuracy, h0=args.h0, params=params,
                  lam_star=lam_star)
        except OSError as err:
            print(f"error: cannot write the plot to {args.plot}: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
