"""Accuracy against ε from a comparison's run folders: ``python scripts/privacy_curve.py DIR``.

Reads ``DIR/*/summary.json`` (``accuracy``, and ``epsilon`` where ``federation.privacy`` was on; a run without
it is "off", drawn at the right end), groups the runs by algorithm and writes ``DIR/privacy_curve.csv`` and
``DIR/privacy_curve.png``. Holds no logic beyond reading and plotting.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from fl_lightning.experiments.figures import comparison_dir_argument, saved_figure


def curve_rows(out_dir: Path) -> list[dict]:
    """One row per run: algorithm, ε (inf: off), δ, σ, accuracy; sorted by algorithm, then ε."""
    rows = []
    for path in sorted(out_dir.glob("*/summary.json")):
        s = json.loads(path.read_text())
        eps = s.get("epsilon")
        rows.append(
            {
                "run": path.parent.name,
                "algorithm": s["algorithm"],
                "epsilon": math.inf if eps is None else float(eps),
                "delta": s.get("delta"),
                "noise_multiplier": s.get("noise_multiplier"),
                "accuracy": s["accuracy"],
            }
        )
    return sorted(rows, key=lambda r: (r["algorithm"], r["epsilon"]))


def write_curve(out_dir: Path) -> list[dict]:
    rows = curve_rows(out_dir)
    with (out_dir / "privacy_curve.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["run", "algorithm", "epsilon", "delta", "noise_multiplier", "accuracy"])
        writer.writeheader()
        writer.writerows(rows)
    finite = [r["epsilon"] for r in rows if math.isfinite(r["epsilon"])]
    off_x = 2 * max(finite) if finite else 1.0  # "off" at the right end
    with saved_figure(out_dir / "privacy_curve.png", figsize=(5, 3.5)) as ax:
        by_method = defaultdict(list)
        for r in rows:
            by_method[r["algorithm"]].append((r["epsilon"] if math.isfinite(r["epsilon"]) else off_x, r["accuracy"]))
        for method, points in by_method.items():
            xs, ys = zip(*sorted(points))
            ax.plot(xs, [100 * y for y in ys], marker="o", label=method)
        ax.set_xscale("log")
        ax.set_xlabel(f"ε (rightmost: off, drawn at {off_x:g})")
        ax.set_ylabel("top-1 accuracy (%)")
        ax.legend()
    return rows


if __name__ == "__main__":
    for row in write_curve(comparison_dir_argument(__doc__)):
        print(f"{row['algorithm']:>10}  ε={row['epsilon']:<8.3g}  accuracy={row['accuracy']:.4f}")
