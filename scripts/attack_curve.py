"""Accuracy against the attackers' fraction from a comparison's run folders: ``python scripts/attack_curve.py DIR``.

Reads each ``DIR/*/config.yaml`` (the run's ``label`` and ``federation.attack.fraction``) and ``summary.json``
(``accuracy``), groups the runs by (label, fraction) — mean and sample std over the seeds — and writes
``DIR/attack_curve.csv``, ``DIR/attack_curve.md`` (labels as rows, fractions as columns, in percent) and
``DIR/attack_curve.png``. Holds no logic beyond reading, grouping and plotting.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from fl_lightning.experiments.figures import comparison_dir_argument, saved_figure


def curve_rows(out_dir: Path) -> list[dict]:
    """One row per (label, attackers' fraction): runs, mean and std (None for one run) of the accuracy."""
    groups: dict[tuple[str, float], list[float]] = defaultdict(list)
    order: list[str] = []
    for path in sorted(out_dir.glob("*/summary.json")):
        cfg = yaml.safe_load((path.parent / "config.yaml").read_text())
        label = cfg.get("label") or cfg["algorithm"]
        order += [label] if label not in order else []
        groups[(label, float(cfg["federation"]["attack"]["fraction"]))].append(json.loads(path.read_text())["accuracy"])
    return [
        {
            "label": label,
            "fraction": fraction,
            "runs": len(acc),
            "accuracy_mean": statistics.fmean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else None,
        }
        for (label, fraction), acc in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1]))
    ]


def markdown(rows: list[dict]) -> str:
    fractions = sorted({r["fraction"] for r in rows})
    cell = {(r["label"], r["fraction"]): r for r in rows}
    lines = [
        "| aggregator | " + " | ".join(f"{100 * f:g} % attackers" for f in fractions) + " |",
        "| --- |" + " --- |" * len(fractions),
    ]
    for label in dict.fromkeys(r["label"] for r in rows):
        cells = []
        for f in fractions:
            r = cell.get((label, f))
            spread = "" if r is None or r["accuracy_std"] is None else f" ± {100 * r['accuracy_std']:.1f}"
            cells.append("—" if r is None else f"{100 * r['accuracy_mean']:.1f}{spread}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_curve(out_dir: Path) -> list[dict]:
    rows = curve_rows(out_dir)
    with (out_dir / "attack_curve.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["label", "fraction", "runs", "accuracy_mean", "accuracy_std"])
        writer.writeheader()
        writer.writerows(rows)
    (out_dir / "attack_curve.md").write_text(markdown(rows))
    with saved_figure(out_dir / "attack_curve.png", figsize=(5, 3.5)) as ax:
        for label in dict.fromkeys(r["label"] for r in rows):
            points = [(r["fraction"], r["accuracy_mean"]) for r in rows if r["label"] == label]
            ax.plot([100 * x for x, _ in points], [100 * y for _, y in points], marker="o", label=label)
        ax.set_xlabel("attacking clients (%)")
        ax.set_ylabel("top-1 accuracy (%)")
        ax.legend()
    return rows


if __name__ == "__main__":
    print(markdown(write_curve(comparison_dir_argument(__doc__))), end="")
