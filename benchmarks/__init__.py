"""Performance benchmarks of FedOPAL, FeDiSyn and the engine at scale, as ratios to same-run baselines.

Run ``python -m benchmarks [fedopal|fedisyn|scale|all] [--quick] [--out FILE.json]``: it prints a
table (figure, value, its threshold, whether it is met) and writes every number,
with the raw repeat times and the sizes used, to JSON. ``--quick`` runs tiny models in seconds (to
check the machinery, not the thresholds); the default runs ViT-B/16 at 224 px with random weights
(nothing is downloaded). Device: CUDA when available (bf16 autocast), else the CPU.

Example:
    >>> results = run_benchmarks(["fedopal"], quick=True)  # doctest: +SKIP
    >>> results["fedopal"]["vpt_cost"]["value"]  # doctest: +SKIP
    1.01
"""

from __future__ import annotations

import importlib
import os
import platform
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

import torch

__all__ = ["BENCHMARKS", "ENGINE_BENCHMARKS", "run_benchmarks", "results_table", "format_value"]

BENCHMARKS: tuple[str, ...] = ("fedopal", "fedisyn")  # the method suites: what "all" runs
# run by name only: the engine at scale (benchmarks/scale.py, an hour at full size), a multi-round
# round against a bare loop (benchmarks/engine.py: minutes) and a comparison of frozen-feature
# methods on the real DINOv2 checkpoint (benchmarks/features.py, not always present)
# and every rank's share of the server's phases (benchmarks/ranks.py: 1, 2, 4 CPU processes, minutes);
# the GPU check (benchmarks/gpu_check.py, scripts/gpu_check.sh: CPU smoke sizes without CUDA or with --quick);
# the data path alone against what a GPU's training step eats (benchmarks/loader.py: a minute)
ENGINE_BENCHMARKS: tuple[str, ...] = ("scale", "engine", "features", "ranks", "gpu_check", "loader")


def _runner(name: str):
    # Imported on demand: each suite pulls in its own heavy libraries (open_clip; diffusers, peft).
    if name in BENCHMARKS + ENGINE_BENCHMARKS:
        return importlib.import_module(f"benchmarks.{name}").run
    raise ValueError(f"unknown benchmark {name!r}; expected one of {BENCHMARKS + ENGINE_BENCHMARKS}")


def run_benchmarks(
    names: Sequence[str],
    *,
    quick: bool,
    device: torch.device | None = None,
    on_suite_start: Callable[[str], None] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the named suites and return ``{"meta": {...}, name: {figure: {...}, "sizes": {...}}}``.

    Args:
        names: a subset of :data:`BENCHMARKS` and :data:`ENGINE_BENCHMARKS`, run in the order given.
        quick: tiny models (seconds) instead of the real sizes (minutes on a CPU).
        device: where to run; default CUDA when available, else the CPU.
        on_suite_start: called with a suite's name before it runs (progress display).
        options: extra keyword arguments of a suite's ``run``, by suite (e.g. ``{"scale": {"clients": [10]}}``).
    """
    from benchmarks._timing import pick_device

    unknown = [n for n in names if n not in BENCHMARKS + ENGINE_BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark {unknown[0]!r}; expected one of {BENCHMARKS + ENGINE_BENCHMARKS}")
    device = device or pick_device()
    meta: dict[str, Any] = {
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": bool(quick),
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
        ),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "autocast": "bf16" if device.type == "cuda" else "none (float32)",
        # Other processes' load skews CPU timings; recorded so a reader can judge the ratios.
        "load_average_1m_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "wall_s": {},
    }
    results: dict[str, Any] = {"meta": meta}
    for name in names:
        if on_suite_start is not None:
            on_suite_start(name)
        start = time.perf_counter()
        results[name] = _runner(name)(quick=quick, device=device, **(options or {}).get(name, {}))
        meta["wall_s"][name] = time.perf_counter() - start
    return results


def format_value(fig: dict[str, Any]) -> str:
    """A figure's value with its unit, for the table (``1.013x``, ``45.2 ms``, ``0.061 %``)."""
    value, unit = fig["value"], fig["unit"]
    if unit == "x":
        return f"{value:.3f}x"
    return f"{value:.4g} {unit}"


def results_table(results: dict[str, Any]):
    """A ``rich.table.Table`` of every figure in ``results`` (from :func:`run_benchmarks`)."""
    from rich.table import Table

    meta = results.get("meta", {})
    title = (
        f"fl_lightning benchmarks — {meta.get('device', '?')} ({meta.get('device_name', '')}), "
        f"{'quick (tiny models)' if meta.get('quick') else 'real sizes'}, torch threads {meta.get('torch_threads')}"
    )
    table = Table(title=title, show_lines=False)
    if meta.get("quick"):
        table.caption = "quick: tiny models check the machinery; the thresholds are meant for the real sizes"
    for column in ("suite", "figure", "value", "threshold", "met", "note"):
        table.add_column(column, overflow="fold")
    for suite in BENCHMARKS + ENGINE_BENCHMARKS:
        for name, fig in results.get(suite, {}).items():
            if not isinstance(fig, dict) or "value" not in fig:
                continue  # "sizes"
            threshold = fig["threshold"]
            limit = "" if threshold is None else f"{'≤' if threshold['op'] == '<=' else '≥'} {threshold['value']:g}"
            met = {None: "", True: "[green]yes[/green]", False: "[red]no[/red]"}[fig["meets"]]
            table.add_row(suite, name, format_value(fig), limit, met, fig.get("note", ""))
    return table
