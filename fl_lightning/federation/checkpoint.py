"""Atomic, safe checkpoints: temp file + rename, and ``torch.load(weights_only=True)`` only."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_save", "safe_load"]


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write ``obj`` (tensors, dicts, lists, numbers, strings) so that ``path`` is never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def safe_load(path: str | Path) -> Any:
    """Load a checkpoint without unpickling arbitrary objects."""
    return torch.load(path, map_location="cpu", weights_only=True)
