"""The pilots of ``synthetic_lambda: auto``: run a config at a few small λ, read (λ, Acc, H) back, fit κ.

The scaling law (``fl_lightning.systems.scaling_law``) is calibrated on cheap pilot runs: each
pilot is a full run of the method at one λ; every round of it is an observation "accuracy Acc was
reached after H simulated seconds" (Acc the best accuracy so far, H the simulated clock,
H_gene + H_pre + Σ H^t). Every synthesis method of the family (FeDiSyn, GPT-FL, FGL) runs its own
when its section says ``synthetic_lambda: auto`` (``synthesis_step.py``). FeDiSyn's command line and
the notebook's in-process pilots are ``fl_lightning.algorithms.fedisyn.pilots``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_lightning.algorithms.synthetic_family.pilot_launch import PilotLaunch
from fl_lightning.federation.storage.run_folder import read_metrics_csv
from fl_lightning.phase_times import item
from fl_lightning.systems.scaling_law import (
    ScalingLawParams,
    fit_scaling_law,
    optimal_lambda,
    synthesis_cost_per_unit_lambda,
)

__all__ = ["PilotPoints", "Calibration", "run_pilot_processes", "pilot_points", "calibrate", "auto_lambda"]


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


def pilot_points(run_dirs: Sequence[str | Path], *, pretrain_epochs: int) -> PilotPoints:
    """Every round of every pilot as (λ, best accuracy so far, simulated time); h0 from the first run.

    h0 = (ĥ + h̃ T̂) D with ĥ, h̃ as the run charged them: H_gene / images and H_pre / (images · T̂).

    Args:
        pretrain_epochs: T̂ of the pilots (the section's ``pretrain_epochs``).
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
            images, D = summary["synthetic_images"], summary["real_samples"]
            h_gen = summary["simulated_generation_s"] / images
            h_pre = summary["simulated_pretraining_s"] / (images * pretrain_epochs)
            h0 = synthesis_cost_per_unit_lambda(h_gen, h_pre, pretrain_epochs, D)
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
        raise ValueError(
            "the pilots' fit puts λ* beyond float range: run pilots that reach different accuracies, "
            "or give synthetic_lambda as a number"
        ) from None
    if cal.lam_star is None or not (math.isfinite(cal.lam_star) and cal.lam_star > 0):
        p = cal.params
        raise ValueError(
            f"the pilots' fit has no minimum in λ (κ1={p.kappa1:.3g}, κ2={p.kappa2:.3g}, h0={points.h0:.3g}): "
            "run pilots that reach different accuracies, or give synthetic_lambda as a number"
        )
    return cal


def run_pilot_processes(
    run_dir: Path,
    section: str,
    lambdas: Sequence[float],
    *,
    rounds: int,
    timeout_s: float | None = None,
    cuda_device: int | None = None,
    round0_root: Path | None = None,
    launch: PilotLaunch | None = None,
) -> list[Path]:
    """The pilots of ``synthetic_lambda: auto``: the run's own ``config.yaml`` at each pilot λ, for ``rounds``
    fine-tuning rounds, each in a fresh single-process ``python -m fl_lightning.train`` (one device, one node: a
    pilot never shares the ranks of the run that asked for it), into ``<run_dir>/pilots/pilot_lam<λ>/``.

    A pilot gets this process's environment without what a launcher set for its ranks
    (:func:`~fl_lightning.federation.ranks.launch.clean_launcher_env`): started from a rank of torchrun, ``fabric run``
    or srun, it would otherwise take itself for one of that launcher's processes (and stop: the launcher's
    world size is not its ``--federation.devices 1``). When the run wrote its round 0's uploads
    (``<run_dir>/pilots/round0_inputs``, ``round0_inputs.py``), every pilot reads them and the run's prompt cache
    (``--<section>.round0_inputs``) instead of encoding the clients and expanding the prompts again.

    Each pilot's round 0 (its images and pre-trained ViT at its λ) is shared under ``round0_root`` (the run's own
    shared folder, ``<output_dir>/round0``) by content key: a comparison's variants that differ only after round 0
    (their fine-tuning) run each pilot's generation and pre-training once, the later ones reusing it.

    Args:
        cuda_device: the CUDA device this rank computes on (None off CUDA): each pilot sees that device only.
        round0_root: the folder the pilots share round 0 in (``--<section>.round0_dir``); None: their own
            (``<run_dir>/pilots/round0``).
        launch: this rank's place in pilots run over all the run's ranks (``pilot_ranks: all``,
            ``pilot_launch.py``): the process started is that rank of each pilot, in the run's layout, and sees the
            devices this rank sees (``cuda_device`` is not used); None: each pilot is a one-process run.

    Raises:
        RuntimeError: a pilot failed (its last stderr line is in the message).
    """
    import os
    import subprocess

    from fl_lightning.algorithms.synthetic_family.round0_inputs import FOLDER, hand_prompts
    from fl_lightning.federation.ranks.launch import clean_launcher_env

    if launch is None:
        env, layout = (
            clean_launcher_env(os.environ, cuda_device=cuda_device),
            ["--federation.devices", "1", "--federation.num_nodes", "1"],
        )
    else:  # this rank of every pilot: torchrun's variables for it, the run's devices per node and nodes
        env, layout = launch.environ(clean_launcher_env(os.environ)), launch.layout_args()
    out, runs = Path(run_dir) / "pilots", []
    inputs = out / FOLDER  # round 0's uploads and prompts, when the run wrote them (round0_inputs.py)
    reuse = ["--" + f"{section}.round0_inputs", str(inputs)] if hand_prompts(inputs, Path(run_dir) / "prompts.json") else []
    for lam in lambdas:
        name = f"pilot_lam{lam:g}"
        argv = [
            sys.executable,
            "-m",
            "fl_lightning.train",
            "--config",
            str(Path(run_dir) / "config.yaml"),
            "--output_dir",
            str(out),
            "--run_name",
            name,
            f"--{section}.synthetic_lambda",
            repr(float(lam)),
            "--federation.rounds",
            str(int(rounds)),
            *layout,
            "--logging.wandb",
            "false",
            *reuse,
            *([f"--{section}.round0_dir", str(round0_root)] if round0_root is not None else []),
        ]
        if (out / name / "summary.json").is_file():  # a resumed run keeps its finished pilots
            runs.append(out / name)
            continue
        start = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
        item("pilot", time.monotonic() - start)  # one pilot's seconds, for the ranks' model (benchmarks/rank_model.py)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"pilot at λ={lam:g} failed: {last}")
        runs.append(out / name)
    return runs
