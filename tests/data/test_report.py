"""partition.csv / partition.png written from a (clients, classes) count table."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from fl_lightning.data.report import partition_figure, write_partition_report
from fl_lightning.errors import ConfigError


def test_report_writes_csv_with_the_right_sums_and_a_png(tmp_path: Path) -> None:
    counts = np.random.default_rng(0).integers(0, 50, (5, 3))
    names = ["cat", "dog", "ship"]
    paths = write_partition_report(counts, names, tmp_path / "out")
    assert set(paths) == {"csv", "png"}
    with paths["csv"].open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["client", "total", *names]
    body = np.array([[int(v) for v in row] for row in rows[1:]])
    np.testing.assert_array_equal(body[:, 0], np.arange(5))
    np.testing.assert_array_equal(body[:, 1], counts.sum(axis=1))
    np.testing.assert_array_equal(body[:, 2:], counts)
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(paths["png"])
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_figure_stays_readable_for_100_clients_by_101_classes(tmp_path: Path) -> None:
    counts = np.random.default_rng(1).integers(0, 30, (100, 101))
    fig = partition_figure(counts, [f"class_{c}" for c in range(101)])
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("class") and ax.get_ylabel().startswith("client")
    assert len(fig.axes) == 2  # heatmap + colorbar
    # Thinned ticks: at most ~40 labels per axis so they do not overlap.
    assert 10 <= len(ax.get_xticks()) <= 41 and 10 <= len(ax.get_yticks()) <= 41
    width, height = fig.get_size_inches()
    assert 8 <= width <= 18 and 8 <= height <= 18
    fig.savefig(tmp_path / "big.png")
    assert (tmp_path / "big.png").stat().st_size > 0


def test_report_rejects_mismatched_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        write_partition_report(np.ones((2, 3), dtype=int), ["a", "b"], tmp_path)
