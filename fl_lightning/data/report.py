"""A table and a heatmap of how a data set was split among clients (``partition.csv``/``.png``).

The figure is built on a bare :class:`matplotlib.figure.Figure` with the Agg canvas — no pyplot
global state, no display needed — so it is safe in worker processes. Loggers get it as pixels
(:func:`partition_image`, an RGB array): W&B's ``wandb.Image(figure)`` compares the figure with
``matplotlib.pyplot`` and fails in a process that never imported pyplot (wandb 0.31), while an array
is read the same whatever the process imported before.

At scale the table keeps every client (10,000 clients × 10 classes: ~0.1 s), while the heatmap
draws at most ``max_rows`` clients, evenly spaced over the client ids and labelled with their real
ids; its title says so, and its totals are those of all clients.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fl_lightning.durable_write import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_HEATMAP_ROWS", "partition_figure", "partition_image", "write_partition_figure", "write_partition_report"]

# Past this many ticks on an axis the labels overlap; show every n-th one instead.
_MAX_TICKS = 40
# Cell values are printed inside the cells only while they stay legible.
_MAX_ANNOTATED_CELLS = 400
# Past this many clients a heatmap row is thinner than a pixel and drawing costs seconds: show an
# evenly spaced sample of this many clients instead.
MAX_HEATMAP_ROWS = 200


def _check(counts: np.ndarray, class_names: list[str]) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts has shape {counts.shape}; expected a (clients, classes) array")
    if counts.shape[1] != len(class_names):
        raise ValueError(f"class_names has {len(class_names)} names; expected one per column of counts ({counts.shape[1]})")
    return counts


def _ticks(n: int) -> np.ndarray:
    step = max(1, int(np.ceil(n / _MAX_TICKS)))
    return np.arange(0, n, step)


def partition_figure(counts: np.ndarray, class_names: list[str], *, max_rows: int = MAX_HEATMAP_ROWS) -> Figure:
    """Heatmap of samples per (client, class), with client totals in the title.

    Args:
        counts: (K, C) samples of class c held by client k (see ``client_class_counts``).
        class_names: C names for the columns.
        max_rows: when K is larger, draw only this many clients, evenly spaced over 0..K-1
            (their y labels are their real ids and the title says how many are shown).

    Returns:
        A matplotlib Figure (Agg canvas attached), sized to stay readable up to ~100 × 100.

    Raises:
        ValueError: ``counts`` is not 2-D or ``class_names`` does not match its columns.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    counts = _check(counts, class_names)
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows={max_rows!r} is not allowed; expected an integer >= 1")
    totals = counts.sum(axis=1)
    num_total = counts.shape[0]
    # Rows drawn: all clients, or an evenly spaced sample of max_rows of them (first and last kept).
    shown = (
        np.unique(np.linspace(0, num_total - 1, max_rows).round().astype(np.int64))
        if num_total > max_rows
        else np.arange(num_total)
    )
    counts = counts[shown]
    num_clients, num_classes = counts.shape
    # 0.12 inch per cell, within [6, 18] inches: 100 clients x 101 classes gives ~14 x 13 inches.
    width = float(np.clip(2.5 + 0.12 * num_classes, 6.0, 18.0))
    height = float(np.clip(1.5 + 0.12 * num_clients, 4.0, 18.0))
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    vmax = max(int(counts.max()) if counts.size else 0, 1)
    im = ax.imshow(counts, aspect="auto", interpolation="nearest", cmap="viridis", norm=Normalize(0, vmax))

    xt, yt = _ticks(num_classes), _ticks(num_clients)
    ax.set_xticks(xt, [str(class_names[i]) for i in xt], rotation=90, fontsize=7)
    ax.set_yticks(yt, [str(int(shown[i])) for i in yt], fontsize=7)
    ax.set_xlabel(f"class ({num_classes})")
    if num_clients < num_total:
        ax.set_ylabel(f"client ({num_clients} of {num_total} shown)")
    else:
        ax.set_ylabel(f"client ({num_total})")
    title = (
        f"samples per client and class — {int(totals.sum())} samples, client sizes "
        f"{int(totals.min()) if totals.size else 0}–{int(totals.max()) if totals.size else 0}"
    )
    if num_clients < num_total:
        title += f"\n{num_clients} of {num_total} clients shown (evenly spaced ids); partition.csv lists all of them"
    ax.set_title(title, fontsize=9)
    if counts.size <= _MAX_ANNOTATED_CELLS:
        for k in range(num_clients):
            for c in range(num_classes):
                value = int(counts[k, c])
                if value:
                    color = "black" if value > 0.6 * vmax else "white"
                    ax.text(c, k, str(value), ha="center", va="center", fontsize=6, color=color)
    fig.colorbar(im, ax=ax, label="samples")
    return fig


def partition_image(counts: np.ndarray, class_names: list[str], *, max_rows: int = MAX_HEATMAP_ROWS) -> np.ndarray:
    """:func:`partition_figure` rendered by its Agg canvas: a ``(H, W, 3)`` uint8 RGB array, the pixels that
    ``partition.png`` holds, for loggers (``WandbLogger.log_image``, TensorBoard) that take images."""
    fig = partition_figure(counts, class_names, max_rows=max_rows)
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def write_partition_report(counts: np.ndarray, class_names: list[str], out_dir: Path, *, figure: bool = True) -> dict[str, Path]:
    """Write ``partition.csv`` and ``partition.png`` describing a split into ``out_dir``.

    The CSV has one row per client: ``client, total, <class name 1>, …, <class name C>``.
    The PNG draws at most :data:`MAX_HEATMAP_ROWS` clients (see :func:`partition_figure`).

    Args:
        counts: (K, C) samples of class c held by client k.
        class_names: C column names.
        out_dir: folder to write into (created if missing).
        figure: also draw the PNG. Drawing it (matplotlib, ~0.7 s on 2 cores) is the slowest part; the
            engine writes the CSV before the first client and the figure once the rounds are done
            (:func:`write_partition_figure`), so that it delays neither the start nor a round.

    Returns:
        ``{"csv": path, "png": path}`` (``"png"`` only when drawn).
    """
    counts = _check(counts, class_names)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "partition.csv"
    table = np.column_stack([np.arange(counts.shape[0]), counts.sum(axis=1), counts]).astype(np.int64)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["client", "total", *[str(name) for name in class_names]])
        writer.writerows(table.tolist())
    if not figure:
        return {"csv": csv_path}
    return {"csv": csv_path, "png": write_partition_figure(counts, class_names, out_dir)}


def write_partition_figure(counts: np.ndarray, class_names: list[str], out_dir: Path) -> Path:
    """Draw :func:`partition_figure` into ``out_dir/partition.png``; returns the path."""
    png_path = Path(out_dir) / "partition.png"
    with atomic_path(png_path) as tmp:  # whole or absent: a sibling run may copy it
        partition_figure(counts, class_names).savefig(tmp, format="png")
    return png_path
