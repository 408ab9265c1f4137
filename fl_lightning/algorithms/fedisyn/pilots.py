"""FeDiSyn's pilots for the scaling law, by hand: in-process pilot runs and the command-line fit.

The pilots that ``synthetic_lambda: auto`` starts, and the fit, are the family's
(``fl_lightning.algorithms.synthetic_family.pilots``); here are FeDiSyn's own ways to drive them.
``notebooks/fedisyn_scaling_law.ipynb`` runs :func:`run_pilots` (FeDiSyn configs, in this process)
and plots.

Command line (fit pilots already reduced to a CSV with the columns ``lambda,accuracy,time_s``)::

    python -m fl_lightning.algorithms.fedisyn.pilots --pilots pilots.csv --target-accuracy 0.8 \\
        --h0 12.5 [--plot out.png]

It prints κ1..κ4 and λ*; the math is ``fl_lightning.systems.scaling_law`` (pure).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fl_lightning.config.loading import load_config
from fl_lightning.errors import UsageError
from fl_lightning.systems.scaling_law import ScalingLawParams, fit_scaling_law, optimal_lambda, total_time

__all__ = ["run_pilots", "main"]


def run_pilots(
    config: str | Path, lambdas: Sequence[float], *, output_dir: str | Path, overrides: Sequence[str] = ()
) -> list[Path]:
    """Run ``config`` once per λ (in this process, W&B off); returns the run folders."""
    from fl_lightning.federation.simulation import Simulation

    runs = []
    for lam in lambdas:
        cfg = load_config(
            config,
            [
                *overrides,
                "--output_dir",
                str(output_dir),
                "--run_name",
                f"pilot_lam{lam:g}",
                "--fedisyn.synthetic_lambda",
                repr(float(lam)),
                "--logging.wandb",
                "false",
            ],
        )
        Simulation(cfg=cfg, loggers=[]).run()
        runs.append(cfg.run_dir)
    return runs


# --- command line -------------------------------------------------------------------------------------


def _read_pilots(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not path.is_file():
        raise UsageError(f"pilot file not found: {path} (give a CSV with columns lambda,accuracy,time_s)")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"lambda", "accuracy", "time_s"} - set(reader.fieldnames or [])
        if missing:
            raise UsageError(f"{path}: missing column(s) {sorted(missing)}; expected the header lambda,accuracy,time_s")
        try:
            rows = [(float(r["lambda"]), float(r["accuracy"]), float(r["time_s"])) for r in reader]
        except (TypeError, ValueError) as err:
            raise UsageError(f"{path}: a value is not a number ({err})") from None
    if not rows:
        raise UsageError(f"{path}: no pilot rows under the header lambda,accuracy,time_s")
    lam, acc, t = (np.array(col) for col in zip(*rows))
    return lam, acc, t


def _plot(
    path: Path, lam: np.ndarray, observed: np.ndarray, *, acc: float, h0: float, params: ScalingLawParams, lam_star: float
) -> None:
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
        description="Fit FeDiSyn's synthetic-data scaling law and print the optimal λ.",
    )
    parser.add_argument("--pilots", type=Path, required=True, help="CSV with columns lambda,accuracy,time_s (>= 4 rows)")
    parser.add_argument("--target-accuracy", type=float, required=True, help="accuracy the federation must reach")
    parser.add_argument("--h0", type=float, required=True, help="synthesis + pre-training seconds per unit λ, (ĥ + h̃ T̂) D")
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
    print(f"kappa1={params.kappa1:.6g} kappa2={params.kappa2:.6g} kappa3={params.kappa3:.6g} kappa4={params.kappa4:.6g}")
    h_star = float(total_time(lam_star, args.target_accuracy, h0=args.h0, params=params))
    print(f"lambda*={lam_star:.6g} (H={h_star:.6g} s at accuracy {args.target_accuracy:g})")
    if args.plot is not None:
        try:
            _plot(args.plot, lam, observed, acc=args.target_accuracy, h0=args.h0, params=params, lam_star=lam_star)
        except OSError as err:
            print(f"error: cannot write the plot to {args.plot}: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
