"""Frozen features once per comparison: a whole comparison of frozen-feature methods against one run.

``comparison_vs_one_run`` — AFL + FedCGS + FedPFT × 3 α × 2 seeds (18 runs) as one comparison through
``python -m fl_lightning.train`` (in this process, an empty ``data.feature_cache``), over one AFL run
of the same config without the cache (what each run cost before it), both measured here. Every run
reads the same backbone's features of the same images (``data.split_seed`` fixed, as CIFAR's official
split), so the backbone runs once per split for the whole comparison: ≤ 2.0.
``uncached_cell_vs_one_run`` — for information, one α × one seed of the three methods with
``data.feature_cache: false`` over the same AFL run (≈ 3: each run repeats the backbone pass).
``cached_equals_uncached`` — 1.0 when those three runs report the very accuracy and loss of their
cached twins in the comparison.

Sizes: the real DINOv2 ViT-S/14 (``~/.cache/fl_lightning/vits14_dinov2.safetensors``; stops at once with
one line when it is missing) on scikit-learn's digits at 56 px, K = 10 clients, FedPFT's defaults
(``conf/fedopal_table2_dinov2_digits.yaml``); ``quick``: a tiny random timm ViT at 32 px.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks._timing import figure

__all__ = ["CHECKPOINT", "run"]

CHECKPOINT = Path("~/.cache/fl_lightning/vits14_dinov2.safetensors")
_ALPHAS = [0.01, 0.1, 1.0]
_SEEDS = [[0, 0], [1, 1]]


def _config(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shared config (AFL's) and FedPFT's section."""
    if quick:
        model = {
            "library": "timm",
            "name": "vit_base_patch16_224",
            "pretrained": None,
            "overrides": {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 2},
        }
        data = {"name": "digits", "image_size": 32, "batch_size": 64, "num_samples": 400}
        fedpft = {"n_components": 2, "tol": 1.0e-4, "max_iter": 100}
    else:
        model = {"library": "timm", "name": "vit_small_patch14_dinov2", "pretrained": None, "checkpoint": str(CHECKPOINT)}
        data = {"name": "digits", "image_size": 56, "batch_size": 64}  # 4 × 4 patches of 14 px
        fedpft = {}  # the FedCGS repo's FedPFT baseline (K = 10 diagonal components)
    return {
        "algorithm": "afl",
        "data": {**data, "split_seed": 0},
        "partition": {"num_clients": 10, "alpha": 0.1},
        "model": model,
        "logging": {"progress": False},
    }, fedpft


def _train(config: dict[str, Any], folder: Path) -> tuple[float, dict[str, dict[str, Any]]]:
    """Run ``config`` with ``python -m fl_lightning.train`` in this process: (seconds, summaries by run name)."""
    from fl_lightning.train import main

    folder.mkdir(parents=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump({**config, "output_dir": str(folder / "runs")}))
    start = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        status = main(["--config", str(path)])
    elapsed = time.monotonic() - start
    if status != 0:
        raise RuntimeError(f"the benchmark's run of {path} exited with {status}")
    summaries = {p.parent.name: json.loads(p.read_text()) for p in (folder / "runs").glob("*/summary.json")}
    return elapsed, summaries


def run(*, quick: bool = False, device: torch.device | None = None) -> dict[str, Any]:
    """The figures (``{name: figure}`` plus ``"sizes"``); the runs use ``federation.accelerator: auto``."""
    from fl_lightning.errors import MissingResourceError

    if not quick and not CHECKPOINT.expanduser().is_file():
        raise MissingResourceError(
            f"the features benchmark needs the DINOv2 ViT-S/14 timm checkpoint at {CHECKPOINT} "
            f"(docs/architecture.md, 'A real backbone for studies'); --quick runs without it"
        )
    import fl_lightning.federation.simulation  # noqa: F401  (imports paid before any timing)

    base, fedpft = _config(quick)
    variants = [
        {"algorithm": "afl", "label": "AFL", "afl": {"lam": 1.0e-6}},
        {"algorithm": "fedcgs", "label": "FedCGS"},
        {"algorithm": "fedpft", "label": "FedPFT", "fedpft": fedpft},
    ]
    comparison = {**base, "variants": variants, "sweep": {"partition.alpha": _ALPHAS, "seed,partition.seed": _SEEDS}}
    off = {**base, "data": {**base["data"], "feature_cache": False}}
    one = {**off, "afl": {"lam": 1.0e-6}}
    with tempfile.TemporaryDirectory(prefix="fl_bench_features_") as tmp:
        one_s, _ = _train(one, Path(tmp) / "one")
        whole_s, cached = _train(comparison, Path(tmp) / "comparison")
        cell_s, uncached = _train({**off, "variants": variants}, Path(tmp) / "cell")
    twins = {name: cached.get(name) for name in uncached}
    same = all(
        t is not None and (t["accuracy"], t["loss"]) == (s["accuracy"], s["loss"])
        for (name, s), t in zip(uncached.items(), twins.values())
    )
    runs = len(variants) * len(_ALPHAS) * len(_SEEDS)
    return {
        "sizes": {
            "quick": quick,
            "runs": runs,
            "model": base["model"]["name"],
            "image_size": base["data"]["image_size"],
            "clients": base["partition"]["num_clients"],
            "one_afl_run_s": one_s,
            "comparison_s": whole_s,
            "uncached_cell_s": cell_s,
        },
        "comparison_vs_one_run": figure(
            whole_s / one_s,
            "x",
            op="<=",
            bound=2.0,
            note=f"{runs} runs (AFL, FedCGS, FedPFT × 3 α × 2 seeds) / one AFL run",
            details={"comparison_s": whole_s, "one_afl_run_s": one_s},
        ),
        "uncached_cell_vs_one_run": figure(
            cell_s / one_s, "x", note="AFL + FedCGS + FedPFT, one α and seed, cache off / one AFL run", details={"cell_s": cell_s}
        ),
        "cached_equals_uncached": figure(
            float(same),
            "x",
            op=">=",
            bound=1.0,
            note="the cache-off runs' accuracy and loss equal their cached twins'",
            details={"runs_compared": len(uncached)},
        ),
    }
