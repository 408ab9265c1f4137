"""The run folder contract (DESIGN.md): config.yaml, summary.json, metrics.csv, checkpoints/."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_metrics_csv", "write_summary", "write_text_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _jsonable(value.item())
    return value


def write_metrics_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """All rounds so far, one row each; columns are the union of the rows' keys in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(_jsonable(summary), indent=2) + "\n")

