"""Measurement helpers shared by the benchmarks: timing, memory and the result record.

Every figure is a RATIO against a baseline measured in the same run (or a size/time reported with
the bound it is held to; the cost contract in docs/architecture.md), so the numbers mean the same on
a laptop CPU and on a GPU.

* Timing: ``time.perf_counter`` around the call, ``warmup`` untimed calls first (allocator, lazy
  init, caches), the MEDIAN of ``repeats`` (robust to one slow repeat on a shared machine). When two
  or more variants are compared, :func:`time_interleaved` runs their repeats round-robin, so a
  drift in machine load hits every variant alike instead of biasing the ratio.
* Memory: ``torch.cuda.max_memory_allocated`` on a GPU (:class:`CudaPeak`). On the CPU no torch
  counter exists, so the benchmarks use the peak RSS of a FRESH process
  (:func:`peak_rss_bytes`, reset just before the measured work where Linux allows it; a fresh
  process so that memory freed by an earlier measurement and kept by the allocator cannot hide a
  later one's growth), ``tracemalloc`` for Python-side objects, and, for training steps,
  the bytes autograd saves for backward (:class:`SavedTensorBytes`) plus gradient and optimiser
  state bytes (:func:`tensor_bytes`).
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ContextManager

import torch
from torch import Tensor

__all__ = [
    "bytes_written",
    "Timing",
    "figure",
    "pick_device",
    "autocast_factory",
    "synchronize",
    "time_call",
    "time_interleaved",
    "CudaPeak",
    "peak_rss_bytes",
    "reset_peak_rss",
    "current_rss_bytes",
    "SavedTensorBytes",
    "tensor_bytes",
]


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of the timed repeats (seconds) and their median."""

    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        ordered = sorted(self.times_s)
        n = len(ordered)
        return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])

    def to_dict(self) -> dict[str, Any]:
        return {"median_s": self.median_s, "times_s": list(self.times_s)}


def figure(
    value: float,
    unit: str,
    *,
    op: str | None = None,
    bound: float | None = None,
    note: str = "",
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One reported figure: its value, the threshold it should meet (``op`` ``'<='``/``'>='``
    ``bound``; none for figures reported for information) and whether it does.

    ``meets`` is recorded, never asserted: a benchmark reports, the reader judges.
    """
    if (op is None) != (bound is None):
        raise ValueError("give both op and bound, or neither")
    if op not in (None, "<=", ">="):
        raise ValueError(f"op must be '<=' or '>=', got {op!r}")
    meets = None
    if op is not None:
        meets = bool(value <= bound) if op == "<=" else bool(value >= bound)
    return {
        "value": float(value),
        "unit": unit,
        "threshold": None if op is None else {"op": op, "value": float(bound)},
        "meets": meets,
        "note": note,
        "details": dict(details or {}),
    }


def pick_device() -> torch.device:
    """CUDA when available, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def autocast_factory(device: torch.device) -> Callable[[], ContextManager]:
    """bf16 autocast on CUDA (how the framework runs there); plain float32 on the CPU."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that perf_counter measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def time_call(fn: Callable[[], object], *, warmup: int, repeats: int, device: torch.device) -> Timing:
    """``warmup`` untimed calls, then ``repeats`` timed ones."""
    return time_interleaved({"fn": fn}, warmup=warmup, repeats=repeats, device=device)["fn"]


def time_interleaved(
    fns: Mapping[str, Callable[[], object]], *, warmup: int, repeats: int, device: torch.device
) -> dict[str, Timing]:
    """Time several variants with their repeats interleaved round-robin.

    The starting variant rotates every round, so none of them is always the one that runs right
    after another (caches, thermal state and other processes' load then cancel out in ratios).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            times[name].append(_timed(fns[name], device))
    return {name: Timing(tuple(t)) for name, t in times.items()}


class CudaPeak:
    """``with CudaPeak(device) as peak: ...`` → ``peak.bytes``: the CUDA allocator's peak inside."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0

    def __enter__(self) -> CudaPeak:
        synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.bytes = int(torch.cuda.max_memory_allocated(self.device))


def bytes_written() -> int:
    """This process's bytes passed to write(2) so far (``wchar`` of /proc/self/io; 0 where absent)."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux ≥ 4.0: ``5 > /proc/self/clear_refs``).

    Returns False where that is not possible; :func:`peak_rss_bytes` is then the peak since start.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size of this process: ``VmHWM`` from /proc (honours :func:`reset_peak_rss`),
    else ``ru_maxrss`` (KiB on Linux, bytes on macOS; the peak since the process started)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def current_rss_bytes() -> int | None:
    """Current resident set size from /proc (Linux), or None where /proc is absent."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes held by the distinct storages behind ``tensors`` (a storage shared twice counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


class SavedTensorBytes:
    """Bytes of the activations autograd keeps for backward, through ``saved_tensors_hooks``.

    On the CPU no allocator counter exists, and these saved tensors are what makes a training
    step's memory grow with the number of trainable blocks. Storages are counted once however
    often they are saved, and storages in ``exclude`` (the parameters: a linear layer saves its
    weight, which is memory the model holds anyway) are not counted.

    Example::

        with SavedTensorBytes(exclude=model.parameters()) as saved:
            loss = model(x).sum()
        loss.backward(); saved.bytes
    """

    def __init__(self, *, exclude: Iterable[Tensor] = ()) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._exclude:
            self._storages[ptr] = max(self._storages.get(ptr, 0), storage.nbytes())
        return t

    @staticmethod
    def _unpack(t: Tensor) -> Tensor:
        return t

    @property
    def bytes(self) -> int:
        return sum(self._storages.values())

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
