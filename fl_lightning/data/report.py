"""A table and a heatmap of how a data set was split among clients (``partition.csv``/``.png``).

The figure is built on a bare :class:`matplotlib.figure.Figure` with the Agg canvas — no pyplot
global state, no display needed — so it is safe in worker processes and can be handed to W&B
(``wandb.Image(partition_figure(...))``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from fl_lightning.errors import ConfigError

__all__ = ["partition_figure", "write_partition_report"]

# Past this many ticks on an axis the labels overlap; show every n-th one instead.
_MAX_TICKS = 40
# Cell values are printed inside the cells only while they stay legible.
_MAX_ANNOTATED_CELLS = 400


def _check(counts: np.ndarray, class_names: list[str]) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ConfigError("counts", f"array of shape {counts.shape}", "a (clients, classes) array")
    if counts.shape[1] != len(class_names):
        raise ConfigError(
            "class_names", f"{len(class_names)} names", f"one name per column ({counts.shape[1]})"
        )
    return counts


def _ticks(n: int) -> np.ndarray:
    step = max(1, int(np.ceil(n / _MAX_TICKS)))
    return np.arange(0, n, step)


def partition_figure(counts: np.ndarray, class_names: list[str]) -> Figure:
    """Heatmap of samples per (client, class), with client totals in the title.

    Args:
        counts: (K, C) samples of class c held by client k (see ``client_class_counts``).
        class_names: C names for the columns.

    Returns:
        A matplotlib Figure (Agg canvas attached), sized to stay readable up to ~100 × 100.
    """
    counts = _check(counts, class_names)
    num_clients, num_classes = counts.shape
    # 0.12 inch per cell, within [6, 18] inches: 100 clients x 101 classes gives ~14 x 13 inches.
    width = float(np.clip(2.5 + 0.12 * num_classes, 6.0, 18.0))
    height = float(np.clip(1.5 + 0.12 * num_clients, 4.0, 18.0))
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    vmax = max(int(counts.max()) if counts.size else 0, 1)
    im = ax.imshow(
        counts, aspect="auto", interpolation="nearest", cmap="viridis", norm=Normalize(0, vmax)
    )

    xt, yt = _ticks(num_classes), _ticks(num_clients)
    ax.set_xticks(xt, [str(class_names[i]) for i in xt], rotation=90, fontsize=7)
    ax.set_yticks(yt, [str(i) for i in yt], fontsize=7)
    ax.set_xlabel(f"class ({num_classes})")
    ax.set_ylabel(f"client ({num_clients})")
    totals = counts.sum(axis=1)
    ax.set_title(
        f"samples per client and class — {int(totals.sum())} samples, client sizes "
        f"{int(totals.min()) if totals.size else 0}–{int(totals.max()) if totals.size else 0}",
        fontsize=9,
    )
    if counts.size <= _MAX_ANNOTATED_CELLS:
        for k in range(num_clients):
            for c in range(num_classes):
                value = int(counts[k, c])
                if value:
                    color = "black" if value > 0.6 * vmax else "white"
                    ax.text(c, k, str(value), ha="center", va="center", fontsize=6, color=color)
    fig.colorbar(im, ax=ax, label="samples")
    return fig


def write_partition_report(
    counts: np.ndarray, class_names: list[str], out_dir: Path
) -> dict[str, Path]:
    """Write ``partition.csv`` and ``partition.png`` describing a split into ``out_dir``.

    The CSV has one row per client: ``client, total, <class name 1>, …, <class name C>``.

    Args:
        counts: (K, C) samples of class c held by client k.
        class_names: C column names.
        out_dir: folder to write into (created if missing).

    Returns:
        ``{"csv": path, "png": path}``.
    """
    counts = _check(counts, class_names)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out_dir / "partition.csv", out_dir / "partition.png"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["client", "total", *[str(name) for name in class_names]])
        for k, row in enumerate(counts):
            writer.writerow([k, int(row.sum()), *[int(v) for v in row]])
    partition_figure(counts, class_names).savefig(png_path)
    return {"csv": csv_path, "png": png_path}
