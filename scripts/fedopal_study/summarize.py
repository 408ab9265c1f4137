"""Table (mean ± std over seeds, markdown) and plot of the sweep's JSON lines.

    python scripts/fedopal_study/summarize.py /tmp/h5res/sweep_s*.jsonl --plot notebooks/fedopal_beyond.png
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

import numpy as np

METHODS = [  # (key, label, rounds, upload per client, client compute vs AFL: see COMPUTE)
    ("afl", "AFL", 1, "S", "1"),
    ("fedopal", "FedOPAL, faithful", 1, "S + P", "6.4"),
    ("restat", "FedOPAL, restat: global", 2, "2S + P", "8.0"),
    ("skip_oneshot", "one shot, min_classes 2", 1, "S + P", "≤ 6.4"),
    ("oneshot_concat", "one shot, [h0, h_P] concat", 1, "4S + P", "7.4"),
    ("skip_oneshot_concat", "one shot, concat + min_classes 2", 1, "4S + P", "≤ 7.4"),
    ("oneshot_meanfix", "one shot, client mean-shift removed", 1, "S + P", "8.0"),
    ("skip_oneshot_meanfix", "one shot, mean-shift removed + min_classes 2", 1, "S + P", "≤ 8.0"),
    ("skip_restat", "FedOPAL+ (prompts → stats, min_classes 2)", 2, "S + 2P", "≤ 6.4"),
    ("shrink_restat", "prompts → stats, skipped vote P_init", 2, "S + 2P", "≤ 6.4"),
    ("restat_concat", "prompts → stats, [h0, h_P] concat", 2, "4S + 2P", "7.4"),
    ("skip_restat_concat", "prompts → stats, concat + min_classes 2", 2, "4S + 2P", "≤ 7.4"),
]
# Client compute in units of AFL's one inference pass (17 tokens at 56 px): a prompted pass has
# 27 tokens (≈ 1.6×), a training step ≈ 3 passes, E = 1 epoch: training 1.6·3·E = 4.8, each prompted
# statistics pass 1.6, the unprompted h0 pass of the concat variants 1. "≤": clients below
# min_classes skip training. Bytes: S = d(d+1)/2 + d·c float64 (d = 384, c = 10: 77,760 values),
# P = M·D = 3,840 float32; the concat variants' d doubles (S ≈ ×4). Upload = client → server;
# download: P (one round) or 2P (two rounds).


def fmt(v: list[float]) -> str:
    return f"{np.mean(v):.1f} ± {np.std(v, ddof=1) if len(v) > 1 else 0:.1f}" if v else "–"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--plot")
    a = ap.parse_args()
    rows = [json.loads(line) for f in a.files for line in open(f) if line.strip()]
    merged: dict = {}
    for r in rows:  # sweep.py and oneshot_fix.py lines of the same (α, seed) are one run
        if "alpha" in r:
            merged.setdefault((r["alpha"], r["seed"]), {}).update(r)
    runs = list(merged.values())
    ceil = [r["ceiling"] for r in rows if "ceiling" in r]
    pinit = [r["p_init"] for r in rows if "p_init" in r]
    alphas = sorted({r["alpha"] for r in runs})
    by = defaultdict(lambda: defaultdict(list))
    for r in runs:
        for k, *_ in METHODS:
            if k in r:
                by[k][r["alpha"]].append(r[k])
    head = "| method | rounds | upload / client | client compute (AFL = 1) | " + " | ".join(
        f"α={'∞' if math.isinf(x) else x}" for x in alphas) + " |"
    print(head)
    print("|" + "---|" * (4 + len(alphas)))
    for k, label, rounds, up, comp in METHODS:
        print(f"| {label} | {rounds} | {up} | {comp} | " + " | ".join(fmt(by[k][x]) for x in alphas) + " |")
    if ceil:
        print(f"| K=1 ceiling (tuned prompts, all data on one client) | – | – | – | {fmt(ceil)} (any α) |")
    if pinit:
        print(f"| untrained prompts P_init, exact statistics (no training) | – | – | – | {fmt(pinit)} (any α) |")
    n = {x: len(by['afl'][x]) for x in alphas}
    print(f"\nseeds per α: {n}")
    # wins / losses vs AFL per run
    for k, label, *_ in METHODS[1:]:
        diffs = [r[k] - r["afl"] for r in runs if k in r and "afl" in r]
        if not diffs:
            continue
        print(f"{label}: min over runs of (method − AFL) = {min(diffs):+.2f}, mean {np.mean(diffs):+.2f}")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = np.arange(len(alphas))
        for k, label, *_ in METHODS:
            if k in ("afl", "fedopal", "restat", "skip_oneshot", "skip_restat", "skip_oneshot_concat"):
                m = [np.mean(by[k][x]) for x in alphas]
                s = [np.std(by[k][x]) for x in alphas]
                ax.errorbar(xs, m, yerr=s, marker="o", capsize=3, label=label)
        if ceil:
            ax.axhline(np.mean(ceil), color="k", ls="--", label="K=1 ceiling")
        ax.set_xticks(xs, [("∞" if math.isinf(x) else str(x)) for x in alphas])
        ax.set_xlabel("Dirichlet α")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title("DINOv2 ViT-S/14, digits 56 px, K=10")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)


if __name__ == "__main__":
    main()
