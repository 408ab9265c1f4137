"""data.name: hf — bad data inputs end as one line (a UsageError: exit status 2), never a traceback or a silently
wrong run: damaged parquet / arrow files, a column of strings named ``image``, natural ids with nulls or of images,
an ambiguous label column, a natural partition of one id, a mistyped path taken for a hub id.
Every data set is a few tiny rows made here; nothing is downloaded."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("datasets")

from fl_lightning.config.loading import load_config  # noqa: E402
from fl_lightning.data.hf import HFSource  # noqa: E402
from fl_lightning.data.registry import build_dataset  # noqa: E402
from fl_lightning.data.transforms import build_transform  # noqa: E402
from fl_lightning.errors import MissingResourceError, UsageError  # noqa: E402
from fl_lightning.federation.run_data import partition_for  # noqa: E402
from tests.conftest import CONF  # noqa: E402

N = 8  # rows of every tiny split; labels 0, 1, 0, 1, …


def _saved(folder: Path, **columns) -> Path:
    """A tiny train/test ``DatasetDict`` written to ``folder`` by ``save_to_disk``: 4x4 RGB images in ``img``, a
    two-class ClassLabel ``label``, then ``columns`` (name → (feature, values); a feature None drops the column)."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    features = {"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])}
    values = {
        "img": [Image.fromarray(rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)) for _ in range(N)],
        "label": [i % 2 for i in range(N)],
    }
    for name, (feature, column) in columns.items():
        features.pop(name, None), values.pop(name, None)  # re-added last: a column given again moves to the end
        if feature is not None:
            features[name], values[name] = feature, column
    table = datasets.Dataset.from_dict(values, features=datasets.Features(features))
    datasets.DatasetDict(train=table, test=table).save_to_disk(str(folder))
    return folder


def _string(values: list) -> tuple:
    import datasets

    return datasets.Value("string"), values


def _class_label(names: list[str]) -> tuple:
    import datasets

    return datasets.ClassLabel(names=names), [i % len(names) for i in range(N)]


@pytest.fixture(autouse=True)
def hf_cache(monkeypatch, tmp_path):
    """HF_HOME / HF_HUB_CACHE of this test only (an empty hub cache, an empty datasets cache)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)


def _build(path, *, download: bool = False, **kw):
    t = build_transform(normalization="imagenet", image_size=4, train=False)
    return build_dataset(
        "hf", root=".", download=download, source=HFSource(path=str(path), **kw), train_transform=t, test_transform=t
    )


def _one_line(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "\n" not in text, text
    return text


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


# 1. a truncated or garbage parquet file


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("layout", ["file", "folder"])
def test_a_damaged_parquet_file_is_one_line_naming_it(tmp_path, damage, layout):
    import datasets

    data = datasets.load_from_disk(str(_saved(tmp_path / "disk")))
    (tmp_path / "pq").mkdir()
    for split in data:
        data[split].to_parquet(str(tmp_path / "pq" / f"{split}-00000-of-00001.parquet"))
    bad = tmp_path / "pq" / "test-00000-of-00001.parquet"
    _truncate(bad) if damage == "truncated" else bad.write_bytes(b"not a parquet file\n" * 20)
    with pytest.raises(UsageError) as info:
        _build(bad, test_split=None) if layout == "file" else _build(tmp_path / "pq")
    text = _one_line(info)
    assert str(bad) in text and "cannot be read" in text and "truncated or not a parquet file" in text, text


# 2. a truncated .arrow file in a save_to_disk folder


def test_a_truncated_arrow_file_of_a_save_to_disk_folder_is_one_line_naming_the_folder(tmp_path):
    bad = next((_saved(tmp_path / "disk") / "test").glob("*.arrow"))
    _truncate(bad)
    with pytest.raises(UsageError) as info:
        _build(tmp_path / "disk")
    text = _one_line(info)
    assert f"data.path '{tmp_path / 'disk'}' (a save_to_disk folder) cannot be read" in text, text
    assert str(bad) in text and "write the folder again with save_to_disk" in text, text


# 3. a column of strings named image


@pytest.mark.parametrize("given", [None, "image"])
def test_a_string_column_named_image_is_one_line(tmp_path, given):
    _saved(tmp_path / "t", img=(None, None), image=_string([f"photos/{i}.png" for i in range(N)]))
    with pytest.raises(UsageError) as info:
        _build(tmp_path / "t", image_column=given)
    text = _one_line(info)
    assert "column 'image'" in text and "holds strings, not images" in text and "data.image_column" in text, text


# 4. natural ids with nulls, or of images


def _natural(path: Path, by: str, num_clients: int) -> list[np.ndarray]:
    cfg = load_config(
        str(CONF / "fedcgs_digits_tiny.yaml"),
        [
            "--data.name",
            "hf",
            "--data.path",
            str(path),
            "--partition.scheme",
            "natural",
            "--partition.by",
            by,
            "--partition.num_clients",
            str(num_clients),
        ],
    )
    splits = _build(path)
    return partition_for(cfg, splits.train_targets, splits.train_column)


@pytest.mark.parametrize(
    "by, words",
    [
        (
            "writer",
            [
                "partition.by='writer' has no value (null) in 2 of the 8 training rows (the first: row 1)",
                "fill or drop those rows",
            ],
        ),
        ("user", ["partition.by='user' has no value (null) in 1 of the 8 training rows (the first: row 0)"]),
        ("img", ["partition.by='img' is a column of Image values, not of ids", "integers or strings"]),
    ],
)
def test_natural_ids_with_nulls_or_of_images_are_one_line(tmp_path, by, words):
    import datasets

    _saved(
        tmp_path / "t",
        writer=_string([None if i in (1, 5) else f"w{i % 3}" for i in range(N)]),
        user=(datasets.Value("int64"), [None, *range(1, N)]),
    )
    with pytest.raises(UsageError) as info:
        _natural(tmp_path / "t", by, 2)
    text = _one_line(info)
    assert all(w in text for w in words), text


# 5. the label column, when data.label_column is null


def test_several_class_label_columns_take_the_one_named_label_and_record_it(tmp_path):
    _saved(tmp_path / "t", domain=_class_label(["photo", "sketch", "art"]), label=_class_label(["a", "b"]))
    found = _build(tmp_path / "t")  # the domain comes before the label
    assert found.classes == ["a", "b"]
    np.testing.assert_array_equal(found.train_targets, np.arange(N) % 2)
    assert found.fingerprint == _build(tmp_path / "t", label_column="label").fingerprint  # records 'label'
    assert found.fingerprint != _build(tmp_path / "t", label_column="domain").fingerprint


def test_a_class_label_domain_beside_an_integer_label_takes_the_label(tmp_path):
    import datasets

    _saved(tmp_path / "t", domain=_class_label(["x", "y", "z"]), label=(datasets.Value("int64"), [i % 2 for i in range(N)]))
    assert _build(tmp_path / "t").classes == ["0", "1"]


def test_several_class_label_columns_and_no_label_is_one_line_listing_them(tmp_path):
    _saved(tmp_path / "t", label=(None, None), fine=_class_label(["a", "b"]), coarse=_class_label(["p", "q", "r"]))
    with pytest.raises(UsageError) as info:
        _build(tmp_path / "t")
    assert _one_line(info) == (
        "cannot tell which column holds the labels: 2 columns could (fine (ClassLabel), "
        "coarse (ClassLabel)); set data.label_column to one of them"
    )


# 6. a natural partition with one distinct id


def test_a_natural_partition_of_one_id_warns_that_it_trains_centrally(tmp_path):
    _saved(tmp_path / "one", writer=_string(["w0"] * N))
    with pytest.warns(UserWarning, match=r"partition.by='writer' holds one value \('w0'\) .* trains centrally"):
        parts = _natural(tmp_path / "one", "writer", 1)
    assert [p.tolist() for p in parts] == [list(range(N))]  # every training row on the one client
    _saved(tmp_path / "two", writer=_string([f"w{i % 2}" for i in range(N)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # two ids, one client: no warning
        _natural(tmp_path / "two", "writer", 1)


# 7. a mistyped path, and offline mode


def test_a_mistyped_relative_path_says_no_such_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with pytest.raises(MissingResourceError) as info:  # shaped like org/name: looked up as a hub id too
        _build("data/cifar10")
    text = _one_line(info)
    assert f"no such local folder {tmp_path / 'data' / 'cifar10'}" in text and "Hugging Face cache" in text, text
    with pytest.raises(MissingResourceError) as info:  # ./…: a path only
        _build("./data/cifar10")
    assert f"no such local file or folder ({tmp_path / 'data' / 'cifar10'})" in _one_line(info)


@pytest.mark.parametrize("download", [False, True])
def test_the_offline_line_names_hf_hub_offline(monkeypatch, download):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets when the library loads
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MissingResourceError) as info:
        _build("lab/absent", download=download)
    text = _one_line(info)
    assert "data.path='lab/absent'" in text and "HF_HUB_OFFLINE=1 is set" in text and "unset it" in text, text
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(MissingResourceError) as info:
        _build("lab/absent")  # downloading off: no request is made
    assert "HF_HUB_OFFLINE" not in _one_line(info)
