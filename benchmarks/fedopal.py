"""FedOPAL performance figures, each a ratio to a baseline measured in the same run.

1. ``statistics_throughput`` — images/s of the framework's statistics collection
   (:func:`~fl_lightning.modules.statistics.collect_statistics` over :class:`PromptedViT` features,
   batches from a ``DataLoader`` over an in-memory ``TensorDataset``) divided by that of a bare
   ``torch.inference_mode()`` loop over the same backbone and the same images doing
   ``h = model(x); R += hᵀh; C += hᵀY`` in float64 (Eq. (7)). Should be ≥ 0.95.
2. ``vpt_cost`` — forward time with M = 10 prompts over M = 0 (Eq. (4)-(5)); ViT-B/16 at 224 has
   1 + 196 tokens, so M = 10 makes 207: ≤ 1.08.
3. ``statistics_memory`` — peak memory of statistics collection with 10× more samples at the same
   batch size, over the peak with 1×: ≤ 1.1 (R, C are folded batch by batch, nothing grows with N).
4. ``server_solve_ms`` / ``server_solve_vs_clients`` — Eq. (9) for d = 768, c = 101 on the CPU;
   the server sums K statistics and solves once, so only the sum grows with K (K = 10, 100).

Sizes: the default runs the real model (open_clip ViT-B-16 at 224, random weights, no download);
``quick`` runs a tiny ViT with ViT-B/16's token geometry (224 px, 16 px patches: 197 tokens) but
width 64 and 2 blocks, so the VPT token ratio is the real one at a fraction of the cost. On the CPU
the default keeps sample counts small so the whole suite runs in minutes on two cores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks._timing import (
    CudaPeak,
    autocast_factory,
    current_rss_bytes,
    figure,
    peak_rss_bytes,
    pick_device,
    reset_peak_rss,
    time_interleaved,
)
from fl_lightning.analytic import AnalyticStatistics, solve_classifier
from fl_lightning.models.backbones import ViTBackbone, build_backbone, build_tiny_backbone, tiny_clip_overrides
from fl_lightning.models.vpt import PromptedViT
from fl_lightning.modules.statistics import collect_statistics

__all__ = ["FedOPALSizes", "sizes_for", "run", "statistics_memory_probe"]

_SEED = 0


@dataclass(frozen=True)
class FedOPALSizes:
    """What each FedOPAL figure runs on (see :func:`sizes_for`)."""

    tiny: bool  # tiny ViT with ViT-B/16's token geometry instead of ViT-B/16 itself
    num_classes: int  # c (Food-101 for the real sizes)
    stats_samples: int
    stats_batch: int
    vpt_batch: int
    memory_samples: int  # 1×; the 10× run uses 10 times as many
    memory_batch: int
    solve_dim: int  # d
    solve_classes: int  # c of the server solve
    solve_clients: tuple[int, ...]  # K values
    samples_per_client: int  # rows behind each client's R_k in the solve benchmark
    warmup: int
    repeats: int


def sizes_for(*, quick: bool, device: torch.device) -> FedOPALSizes:
    """Sizes for ``quick`` (tiny, seconds) or the real model on ``device``.

    On the CPU a ViT-B/16 forward costs ~0.4 s per 224² image on two cores, so the default uses
    2 batches of 8 for throughput and 4 → 40 images for memory (~2 minutes in all). On a GPU the
    batches are the size a client would use.
    """
    solve = dict(solve_dim=768, solve_classes=101, solve_clients=(10, 100), samples_per_client=32)
    if quick:  # d = 192 (ViT-Ti width) keeps the K = 100 sum cheap
        return FedOPALSizes(
            tiny=True,
            num_classes=10,
            stats_samples=32,
            stats_batch=8,
            vpt_batch=8,
            memory_samples=8,
            memory_batch=8,
            warmup=1,
            repeats=3,
            solve_dim=192,
            solve_classes=10,
            solve_clients=(10, 100),
            samples_per_client=32,
        )
    if device.type == "cuda":
        return FedOPALSizes(
            tiny=False,
            num_classes=101,
            stats_samples=1024,
            stats_batch=128,
            vpt_batch=128,
            memory_samples=256,
            memory_batch=64,
            warmup=2,
            repeats=7,
            **solve,
        )
    return FedOPALSizes(
        tiny=False,
        num_classes=101,
        stats_samples=16,
        stats_batch=8,
        vpt_batch=4,
        memory_samples=4,
        memory_batch=4,
        warmup=1,
        repeats=3,
        **solve,
    )


@contextlib.contextmanager
def _quiet_logging() -> Iterator[None]:
    # open_clip logs "No pretrained weights loaded" on the root logger: random weights are the point here.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _build_backbone(tiny: bool) -> ViTBackbone:
    """open_clip ViT-B-16 (random weights, pretrained=None: nothing is downloaded), or a tiny ViT with
    the same 224 px / 16 px patch geometry (197 tokens) but width 64 and 2 blocks."""
    if tiny:
        vision = tiny_clip_overrides(224, patch_size=16, width=64, depth=2)["vision_cfg"]
        return build_tiny_backbone("open_clip", image_size=224, seed=_SEED, overrides={"vision_cfg": vision})
    with torch.random.fork_rng(devices=[]), _quiet_logging():
        torch.manual_seed(_SEED)
        return build_backbone(library="open_clip", name="ViT-B-16", pretrained=None)


# -- 1. statistics throughput ---------------------------------------------------------------------
def _statistics_throughput(model: nn.Module, sizes: FedOPALSizes, device: torch.device) -> dict[str, Any]:
    autocast = autocast_factory(device)
    n, b, c = sizes.stats_samples, sizes.stats_batch, sizes.num_classes
    g = torch.Generator().manual_seed(_SEED)
    size = model.backbone.image_size
    images = torch.randn(n, 3, size, size, generator=g)
    labels = torch.randint(c, (n,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=b, shuffle=False)
    d = model.feature_dim
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def framework() -> None:
        stats = collect_statistics(
            model, loader, num_classes=c, device=device, autocast=autocast if device.type == "cuda" else None
        )
        out["framework"] = (stats.R, stats.C)

    def bare() -> None:
        # The baseline: no DataLoader, no checks, no symmetrisation — slices of the same tensors.
        R = torch.zeros(d, d, dtype=torch.float64, device=device)
        C = torch.zeros(d, c, dtype=torch.float64, device=device)
        with torch.inference_mode():
            for start in range(0, n, b):
                x = images[start : start + b].to(device)
                y = labels[start : start + b].to(device)
                with autocast():
                    h = model(x)
                h = h.to(torch.float64)  # (B, d)
                R += h.T @ h
                C += h.T @ F.one_hot(y, c).to(torch.float64)
        out["bare"] = (R, C)

    timings = time_interleaved({"framework": framework, "bare": bare}, warmup=sizes.warmup, repeats=sizes.repeats, device=device)
    t_fw, t_bare = timings["framework"].median_s, timings["bare"].median_s
    # Same numbers either way (a check that the two loops did the same work).
    R_fw, R_bare = out["framework"][0], out["bare"][0]
    rel = float((R_fw - R_bare).norm() / R_bare.norm().clamp_min(1e-300))
    return figure(
        t_bare / t_fw,
        "x",
        op=">=",
        bound=0.95,
        note="framework / bare images per second",
        details={
            "framework_images_per_s": n / t_fw,
            "bare_images_per_s": n / t_bare,
            "framework": timings["framework"].to_dict(),
            "bare": timings["bare"].to_dict(),
            "samples": n,
            "batch_size": b,
            "feature_dim": d,
            "num_classes": c,
            "relative_difference_R": rel,
        },
    )


# -- 2. VPT cost ------------------------------------------------------------------------------------
def _vpt_cost(backbone: ViTBackbone, sizes: FedOPALSizes, device: torch.device) -> dict[str, Any]:
    autocast = autocast_factory(device)
    models = {m: PromptedViT(backbone, num_prompts=m, seed=_SEED).to(device) for m in (0, 10)}
    size = backbone.image_size
    x = torch.randn(sizes.vpt_batch, 3, size, size, generator=torch.Generator().manual_seed(_SEED)).to(device)

    def forward(model: nn.Module):
        def call() -> None:
            with torch.inference_mode(), autocast():
                model(x)

        return call

    timings = time_interleaved(
        {f"M={m}": forward(model) for m, model in models.items()}, warmup=sizes.warmup, repeats=sizes.repeats, device=device
    )
    patches = (size // backbone.patch_size) ** 2
    tokens = {m: backbone.num_prefix_tokens + m + patches for m in models}
    return figure(
        timings["M=10"].median_s / timings["M=0"].median_s,
        "x",
        op="<=",
        bound=1.08,
        note=f"forward time M=10 / M=0 ({tokens[10]} vs {tokens[0]} tokens)",
        details={
            "tokens_M0": tokens[0],
            "tokens_M10": tokens[10],
            "token_ratio": tokens[10] / tokens[0],
            "batch_size": sizes.vpt_batch,
            "M0": timings["M=0"].to_dict(),
            "M10": timings["M=10"].to_dict(),
        },
    )


# -- 3. statistics memory -----------------------------------------------------------------------------
class _GeneratedImages(Dataset):
    """Random images made on demand from (seed, index): the data set itself takes no memory, so the
    measured peak is the collector's working memory, whatever the number of samples."""

    def __init__(self, *, num_samples: int, image_size: int, num_classes: int, seed: int) -> None:
        self.n, self.size, self.c, self.seed = num_samples, image_size, num_classes, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return torch.randn(3, self.size, self.size, generator=g), int(torch.randint(self.c, (1,), generator=g))


def statistics_memory_probe(*, tiny: bool, num_samples: int, batch_size: int, num_classes: int, device: str) -> dict[str, Any]:
    """Collect statistics over ``num_samples`` generated images and report the memory it took.

    On the CPU this is meant to run in a FRESH process (memory an earlier run freed but the
    allocator kept would hide this run's growth): the process's peak RSS during collection (reset
    just before it, on Linux), the RSS just before, and the Python-side peak (``tracemalloc``). On
    CUDA: the allocator's peak during collection.
    """
    dev = torch.device(device)
    model = PromptedViT(_build_backbone(tiny), num_prompts=10, seed=_SEED).to(dev)
    data = _GeneratedImages(num_samples=num_samples, image_size=model.backbone.image_size, num_classes=num_classes, seed=_SEED)
    loader = DataLoader(data, batch_size=batch_size, shuffle=False)
    autocast = autocast_factory(dev) if dev.type == "cuda" else None
    result: dict[str, Any] = {"samples": num_samples, "batch_size": batch_size}
    if dev.type == "cuda":
        with CudaPeak(dev) as peak:
            stats = collect_statistics(model, loader, num_classes=num_classes, device=dev, autocast=autocast)
        result["peak_bytes"] = peak.bytes
    else:
        result["rss_before_bytes"] = current_rss_bytes()
        result["peak_reset"] = reset_peak_rss()  # else the peak may be the imports', not the collection's
        tracemalloc.start()
        stats = collect_statistics(model, loader, num_classes=num_classes, device=dev)
        result["python_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        result["peak_bytes"] = peak_rss_bytes()
    result["collected"] = stats.N
    return result


def _probes_in_fresh_processes(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run :func:`statistics_memory_probe` once per kwargs in ``runs``, each in a new Python process.

    The processes run side by side: only their peak memory is read, never their time.
    """
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    code = (
        "import json, sys; from benchmarks.fedopal import statistics_memory_probe as probe; "
        "print(json.dumps(probe(**json.loads(sys.argv[1]))))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(kwargs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for kwargs in runs
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"statistics memory probe failed (exit {proc.returncode}): {err.strip()[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _statistics_memory(sizes: FedOPALSizes, device: torch.device) -> dict[str, Any]:
    factors = (1, 10)
    kwargs = [
        dict(
            tiny=sizes.tiny,
            num_samples=f * sizes.memory_samples,
            batch_size=sizes.memory_batch,
            num_classes=sizes.num_classes,
            device=str(device),
        )
        for f in factors
    ]
    if device.type == "cuda":
        found = [statistics_memory_probe(**kw) for kw in kwargs]
    else:
        found = _probes_in_fresh_processes(kwargs)
    runs = dict(zip(factors, found))
    details: dict[str, Any] = {"1x": runs[1], "10x": runs[10]}
    if device.type == "cuda":
        method = "torch.cuda.max_memory_allocated during collection"
    else:
        method = (
            "peak RSS during collection, one fresh process per run (VmHWM reset before collecting, "
            "else ru_maxrss); python_peak_bytes from tracemalloc"
        )
        grown = [runs[f]["peak_bytes"] - (runs[f]["rss_before_bytes"] or 0) for f in (1, 10)]
        details["growth_during_collection_bytes"] = {"1x": grown[0], "10x": grown[1]}
    details["method"] = method
    return figure(
        runs[10]["peak_bytes"] / runs[1]["peak_bytes"],
        "x",
        op="<=",
        bound=1.1,
        note=f"peak memory, {10 * sizes.memory_samples} vs {sizes.memory_samples} samples",
        details=details,
    )


# -- 4. server solve -----------------------------------------------------------------------------------
def _client_statistics(k: int, *, d: int, c: int, rows: int) -> AnalyticStatistics:
    """A client's R_k = HᵀH, C_k = HᵀY from ``rows`` random features (rank ``rows``: only a sum of
    enough clients is full rank, as in FedOPAL with small clients)."""
    g = torch.Generator().manual_seed(_SEED + 1 + k)
    h = torch.randn(rows, d, generator=g, dtype=torch.float64)
    y = torch.randint(c, (rows,), generator=g)
    return AnalyticStatistics.zeros(d, c).update(h, y)


def _server_solve(sizes: FedOPALSizes) -> tuple[dict[str, Any], dict[str, Any]]:
    cpu = torch.device("cpu")
    d, c, lam = sizes.solve_dim, sizes.solve_classes, 1.0
    clients = [_client_statistics(k, d=d, c=c, rows=sizes.samples_per_client) for k in range(max(sizes.solve_clients))]
    repeats = max(7, sizes.repeats)
    totals = {K: sum(clients[:K]) for K in sizes.solve_clients}
    t_sum = time_interleaved(
        {str(K): (lambda K=K: sum(clients[:K])) for K in sizes.solve_clients}, warmup=1, repeats=repeats, device=cpu
    )
    t_solve = time_interleaved(
        {str(K): (lambda K=K: solve_classifier(totals[K].R, totals[K].C, lam=lam)) for K in sizes.solve_clients},
        warmup=1,
        repeats=repeats,
        device=cpu,
    )
    per_k = {
        str(K): {
            "sum_ms": 1e3 * t_sum[str(K)].median_s,
            "solve_ms": 1e3 * t_solve[str(K)].median_s,
            "sum_ms_per_client": 1e3 * t_sum[str(K)].median_s / K,
        }
        for K in sizes.solve_clients
    }
    k_lo, k_hi = str(min(sizes.solve_clients)), str(max(sizes.solve_clients))
    details = {"d": d, "c": c, "lambda": lam, "per_num_clients": per_k}
    solve_ms = per_k[k_hi]["solve_ms"]
    solve = figure(solve_ms, "ms", note=f"Eq. (9) Cholesky solve, d={d}, c={c}, CPU float64", details=details)
    growth = figure(
        per_k[k_hi]["solve_ms"] / per_k[k_lo]["solve_ms"],
        "x",
        op="<=",
        bound=1.25,
        note=f"solve time K={k_hi} / K={k_lo} (only the sum grows with K)",
        details=details,
    )
    return solve, growth


def run(*, quick: bool = False, device: torch.device | None = None) -> dict[str, Any]:
    """All FedOPAL figures: ``{name: figure}`` plus ``"sizes"``."""
    device = device or pick_device()
    sizes = sizes_for(quick=quick, device=device)
    backbone = _build_backbone(sizes.tiny)
    prompted = PromptedViT(backbone, num_prompts=10, seed=_SEED).to(device)
    results: dict[str, Any] = {"sizes": asdict(sizes)}
    results["statistics_throughput"] = _statistics_throughput(prompted, sizes, device)
    results["vpt_cost"] = _vpt_cost(backbone, sizes, device)
    del prompted, backbone
    results["statistics_memory"] = _statistics_memory(sizes, device)
    results["server_solve_ms"], results["server_solve_vs_clients"] = _server_solve(sizes)
    return results
