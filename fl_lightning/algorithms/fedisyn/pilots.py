"""Pilot runs for FeDiSyn's scaling law: run a config at a few small λ, read (λ, Acc, H) back, fit κ.

The scaling law (``fl_lightning.systems.scaling_law``) is calibrated on cheap pilot runs: each
pilot is a full FeDiSyn run at one λ; every round of it is an observation "accuracy Acc was
reached after H simulated seconds" (Acc the best accuracy so far, H the simulated clock,
H_gene + H_pre + Σ H^t). ``notebooks/fedisyn_scaling_law.ipynb`` drives these functions and plots.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_lightning.config import load_config
from fl_lightning.systems.scaling_law import (
    ScalingLawParams,
    fit_scaling_law,
    optimal_lambda,
    synthesis_cost_per_unit_lambda,
)

__all__ = ["PilotPoints", "Calibration", "run_pilots", "pilot_points", "calibrate"]


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


def pilot_points(run_dirs: Sequence[str | Path]) -> PilotPoints:
    """Every round of every pilot as (λ, best accuracy so far, simulated time); h0 from the first run.

    h0 = (ĥ + h̃ T̂) D with ĥ, h̃ as the run charged them: H_gene / images and H_pre / (images · T̂).
    """
    lam, acc, time_s, h0 = [], [], [], math.nan
    for run in map(Path, run_dirs):
        summary = json.loads((run / "summary.json").read_text())
        with (run / "metrics.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        best = 0.0
        for row in rows:
            best = max(best, float(row["accuracy"]))
            lam.append(summary["lambda"])
            acc.append(best)
            time_s.append(float(row["simulated_time_s"]))
        if math.isnan(h0):
            cfg = load_config(run / "config.yaml")
            images, D = summary["synthetic_images"], summary["real_samples"]
            h_gen = summary["simulated_generation_s"] / images
            h_pre = summary["simulated_pretraining_s"] / (images * cfg.fedisyn.pretrain_epochs)
            h0 = synthesis_cost_per_unit_lambda(h_gen, h_pre, cfg.fedisyn.pretrain_epochs, D)
    return PilotPoints(np.array(lam), np.array(acc), np.array(time_s), float(h0))


def calibrate(points: PilotPoints, target_accuracy: float) -> Calibration:
    """κ1..κ4 by Levenberg–Marquardt on the pilots, and λ* at ``target_accuracy`` when it exists."""
    params = fit_scaling_law(points.lam, points.acc, points.time_s, h0=points.h0)
    ok = params.kappa1 > 0 and params.kappa2 > 0 and points.h0 > 0
    lam_star = optimal_lambda(target_accuracy, h0=points.h0, params=params) if ok else None
    return Calibration(params, float(target_accuracy), lam_star)
