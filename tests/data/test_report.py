"""partition.csv / partition.png written from a (clients, classes) count table."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from fl_lightning.data.report import MAX_HEATMAP_ROWS, partition_figure, write_partition_report
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
    with pytest.raises(ValueError, match="class_names has 2 names") as info:
        write_partition_report(np.ones((2, 3), dtype=int), ["a", "b"], tmp_path)
    assert not isinstance(info.value, ConfigError)  # pure code: the config layer owns ConfigError
    with pytest.raises(ValueError, match="counts has shape"):
        partition_figure(np.ones(3, dtype=int), ["a", "b", "c"])


def test_ten_thousand_clients_keep_every_row_in_the_csv_and_a_sample_in_the_figure(tmp_path: Path) -> None:
    k, names = 10_000, [f"c{i}" for i in range(10)]
    counts = np.random.default_rng(2).integers(0, 9, (k, 10))
    paths = write_partition_report(counts, names, tmp_path)
    with paths["csv"].open(newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == k + 1
    body = np.array(rows[1:], dtype=np.int64)
    np.testing.assert_array_equal(body[:, 0], np.arange(k))
    np.testing.assert_array_equal(body[:, 1], counts.sum(axis=1))
    np.testing.assert_array_equal(body[:, 2:], counts)

    fig = partition_figure(counts, names)
    ax = fig.axes[0]
    image = ax.get_images()[0].get_array()
    assert image.shape == (MAX_HEATMAP_ROWS, 10)
    shown = np.linspace(0, k - 1, MAX_HEATMAP_ROWS).round().astype(int)
    np.testing.assert_array_equal(image, counts[shown])  # the drawn rows are those clients' rows
    labels = [int(t.get_text()) for t in ax.get_yticklabels()]
    assert labels[0] == 0 and set(labels) <= set(shown.tolist())  # ticks carry real client ids
    assert f"{MAX_HEATMAP_ROWS} of {k} clients shown" in ax.get_title()
    assert f"{int(counts.sum())} samples" in ax.get_title()  # totals are over all clients
    assert ax.get_ylabel() == f"client ({MAX_HEATMAP_ROWS} of {k} shown)"


def test_a_comparison_draws_each_partition_once(tmp_path: Path) -> None:
    """A run whose partition.csv is byte-identical to a sibling run's (a comparison's methods on one
    partition) is given that run's drawing; another partition, or an undrawn sibling, is not a twin."""
    from fl_lightning.federation.run_data import drawn_twin as _drawn_twin

    counts = np.random.default_rng(0).integers(0, 50, (4, 3))
    names = ["a", "b", "c"]
    first = write_partition_report(counts, names, tmp_path / "afl_s0")
    assert not list((tmp_path / "afl_s0").glob(".partition.*"))  # drawn whole, then renamed into place
    write_partition_report(counts, names, tmp_path / "fedcgs_s0", figure=False)
    write_partition_report(counts + 1, names, tmp_path / "afl_s1", figure=False)
    write_partition_report(counts, names, tmp_path / "undrawn", figure=False)
    assert _drawn_twin(tmp_path / "fedcgs_s0") == first["png"]
    assert _drawn_twin(tmp_path / "afl_s1") is None  # other counts
    assert _drawn_twin(tmp_path / "afl_s0") is None  # never its own figure
    (tmp_path / "afl_s0" / "partition.png").unlink()
    assert _drawn_twin(tmp_path / "undrawn") is None  # no sibling has a drawing
