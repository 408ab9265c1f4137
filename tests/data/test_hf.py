"""data.name: hf — Hugging Face data sets from a save_to_disk folder, parquet files and a hub id in the HF cache,
natural partitions by a writer column, the one-line errors; built offline from data the tests make."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("datasets")

from fl_lightning import train  # noqa: E402
from fl_lightning.config.loading import load_config  # noqa: E402
from fl_lightning.data.hf import (
    HFSource,  # noqa: E402
    hf_source,
)
from fl_lightning.data.partition import natural_grouping_note, natural_partition  # noqa: E402
from fl_lightning.data.registry import build_dataset  # noqa: E402
from fl_lightning.data.transforms import build_transform  # noqa: E402
from fl_lightning.errors import ConfigError, MissingResourceError, UsageError  # noqa: E402
from fl_lightning.federation.run_data import partition_for
from fl_lightning.federation.simulation import Simulation  # noqa: E402
from tests.conftest import CONF, REPO, run_cli  # noqa: E402

N_TRAIN, N_TEST, WRITERS = 40, 12, 5


def _tables():
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"]), "writer": datasets.Value("string")}
    )

    def table(n: int):
        images = [Image.fromarray(rng.integers(0, 255, (10, 12, 3), dtype=np.uint8)) for _ in range(n)]
        return datasets.Dataset.from_dict(
            {"img": images, "label": [i % 3 for i in range(n)], "writer": [f"w{(7 * i) % WRITERS}" for i in range(n)]},
            features=features,
        )

    return datasets.DatasetDict(train=table(N_TRAIN), test=table(N_TEST))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """The same tiny data set three ways: save_to_disk, a folder of parquet files, a hub snapshot in a cache."""
    root = tmp_path_factory.mktemp("hf")
    data = _tables()
    data.save_to_disk(str(root / "disk"))
    (root / "parquet").mkdir()
    for split in data:
        data[split].to_parquet(str(root / "parquet" / f"{split}-00000-of-00001.parquet"))
    snapshot = root / "hub" / "datasets--lab--tiny-writers" / "snapshots" / ("a" * 40)
    (snapshot / "data").mkdir(parents=True)
    for split in data:
        (snapshot / "data" / f"{split}-00000-of-00001.parquet").write_bytes(
            (root / "parquet" / f"{split}-00000-of-00001.parquet").read_bytes()
        )
    (root / "hub" / "datasets--lab--tiny-writers" / "refs").mkdir()
    (root / "hub" / "datasets--lab--tiny-writers" / "refs" / "main").write_text("a" * 40)
    return {
        "disk": root / "disk",
        "parquet": root / "parquet",
        "hub": root / "hub",
        "root": root,
        "file": root / "parquet" / "train-00000-of-00001.parquet",
    }


@pytest.fixture
def hf_cache(saved, monkeypatch, tmp_path):
    """HF_HOME / HF_HUB_CACHE of this test only: the hub snapshot above, an empty datasets cache."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(saved["hub"]))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    return saved["hub"]


def _by_writer(path) -> list[str]:
    """The command-line overrides of a run on the hf data set at ``path``, its clients by the ``writer`` column."""
    return ["--data.name", "hf", "--data.path", str(path), "--partition.scheme", "natural", "--partition.by", "writer"]


def _build(path, **kw):
    t = build_transform(normalization="imagenet", image_size=8, train=False)
    return build_dataset("hf", root=".", source=HFSource(path=str(path), **kw), train_transform=t, test_transform=t)


@pytest.mark.parametrize("form", ["disk", "parquet", "hub"])
def test_every_form_gives_the_same_splits(saved, hf_cache, form):
    path = "lab/tiny-writers" if form == "hub" else saved[form]
    splits = _build(path)
    assert splits.classes == ["a", "b", "c"]
    assert len(splits.train) == N_TRAIN and len(splits.test) == N_TEST
    np.testing.assert_array_equal(splits.train_targets, np.arange(N_TRAIN) % 3)
    image, target = splits.train[4]
    assert tuple(image.shape) == (3, 8, 8) and target == 1  # decoded, RGB, through the transform
    assert len(splits.fingerprint) == 64
    assert list(splits.train_column("writer")[:3]) == ["w0", "w2", "w4"]


def test_fingerprint_follows_the_content(saved, hf_cache, tmp_path):
    import datasets

    other = _tables()
    other["train"] = other["train"].map(lambda r: {"label": (r["label"] + 1) % 3})
    other.save_to_disk(str(tmp_path / "other"))
    assert _build(saved["disk"]).fingerprint != _build(tmp_path / "other").fingerprint
    assert _build(saved["disk"]).fingerprint == _build(saved["disk"]).fingerprint
    assert isinstance(datasets.load_from_disk(str(saved["disk"])), datasets.DatasetDict)


def test_one_file_and_a_seeded_4_to_1_split(saved, hf_cache):
    splits = _build(saved["file"], test_split=None)
    assert len(splits.train) + len(splits.test) == N_TRAIN and len(splits.test) == N_TRAIN // 5
    assert len(splits.train_column("writer")) == len(splits.train)


def test_num_samples_subset_keeps_the_column_aligned(saved, hf_cache):
    full = _build(saved["disk"])
    t = build_transform(normalization="imagenet", image_size=8, train=False)
    sub = build_dataset(
        "hf", root=".", source=HFSource(path=str(saved["disk"])), train_transform=t, test_transform=t, num_samples=10, seed=3
    )
    assert len(sub.train) == 10 and len(sub.train_column("writer")) == 10
    keep = sub.train.indices
    np.testing.assert_array_equal(sub.train_column("writer"), full.train_column("writer")[keep])


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"image_column": "photo"}, ["data.image_column='photo'", "img (Image)", "label (ClassLabel)", "writer (Value)"]),
        ({"label_column": "writer2"}, ["data.label_column='writer2'", "writer (Value)"]),
        ({"test_split": "validation"}, ["data.test_split='validation'", "['test', 'train']"]),
    ],
)
def test_bad_columns_and_splits_are_one_line(saved, hf_cache, kw, words):
    with pytest.raises(UsageError) as info:
        _build(saved["disk"], **kw)
    assert "\n" not in str(info.value) and all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("spec", ["train[:25%]", "train[10:30]", "train[-7:]", "train[:10%]+test[50%:]"])
@pytest.mark.parametrize("form", ["disk", "parquet"])
def test_a_split_slice_gives_the_rows_load_dataset_gives(saved, hf_cache, spec, form):
    """``data.train_split: train[:25%]``: the rows ``datasets.load_dataset(..., split=...)`` gives, in order."""
    import datasets

    splits = _build(saved[form], train_split=spec)
    theirs = (
        datasets.load_dataset(str(saved["parquet"]), split=spec)
        if form == "parquet"
        else datasets.concatenate_datasets(
            [
                datasets.load_from_disk(str(saved["disk"]))[p.splitname].select(range(p.from_, p.to))
                for p in datasets.ReadInstruction.from_spec(spec).to_absolute({"train": N_TRAIN, "test": N_TEST})
            ]
        )
    )
    assert len(splits.train) == len(theirs)
    np.testing.assert_array_equal(splits.train_targets, np.asarray(theirs["label"]))
    assert list(splits.train_column("writer")) == theirs["writer"]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("train[:x]", "Unrecognized instruction format"),
        ("validation[:10%]", "Unknown split"),
        ("train[5:5]", "a slice that holds rows"),
    ],
)
def test_a_bad_split_slice_is_one_line(saved, hf_cache, spec, words):
    with pytest.raises(UsageError) as info:
        _build(saved["disk"], train_split=spec)
    assert "\n" not in str(info.value) and f"data.train_split={spec!r}" in str(info.value) and words in str(info.value)


def test_a_split_slice_beside_the_flower_convention_is_refused():
    with pytest.raises(ConfigError, match=r"data.train_split='train\[:10%\]' is not allowed; expected a whole split's"):
        load_config(
            CONF / "fedcgs_digits_tiny.yaml",
            [
                "--data.name",
                "hf",
                "--data.path",
                "lab/x",
                "--data.train_split",
                "train[:10%]",
                "--partition.convention",
                "flower",
            ],
        )


def test_data_cache_dir_holds_the_hub_snapshot_and_the_arrow_tables(saved, monkeypatch, tmp_path):
    """``data.cache_dir``: a hub id's snapshot is read from that hub cache (the environment's is empty here), and
    datasets writes its Arrow tables under ``<cache_dir>/datasets``; the preflight looks there too."""
    import shutil

    from fl_lightning.preflight import check_data

    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    cache = tmp_path / "cache"
    shutil.copytree(saved["hub"], cache)
    with pytest.raises(MissingResourceError):  # not in the environment's cache
        _build("lab/tiny-writers")
    splits = _build("lab/tiny-writers", cache_dir=str(cache))
    assert len(splits.train) == N_TRAIN and len(splits.test) == N_TEST
    assert (cache / "datasets").is_dir() and any((cache / "datasets").iterdir())
    assert not (tmp_path / "home" / "datasets").exists()
    cfg = load_config(
        CONF / "fedcgs_digits_tiny.yaml", ["--data.name", "hf", "--data.path", "lab/tiny-writers", "--data.cache_dir", str(cache)]
    )
    assert hf_source(cfg.data).cache_dir == str(cache)
    check_data(cfg)  # finds the snapshot in data.cache_dir
    with pytest.raises(
        ConfigError,
        match=r"data.cache_dir=.* is not allowed; expected null, or a folder for data.name "
        r"hf's",
    ):
        load_config(CONF / "fedcgs_digits_tiny.yaml", ["--data.cache_dir", str(cache)])


def test_undetectable_image_column_lists_the_columns(tmp_path, hf_cache):
    import datasets

    datasets.Dataset.from_dict({"pixels": [[0, 1]] * 4, "y": [0, 1, 0, 1]}).save_to_disk(str(tmp_path / "t"))
    with pytest.raises(
        UsageError,
        match=r"^cannot tell which column holds the images; set data.image_column to "
        r"one of the data set's columns: pixels \(List\), y \(Value\)$",
    ):
        _build(tmp_path / "t", test_split=None)


def test_hub_id_not_in_the_cache_is_one_line_with_the_fetch_command(hf_cache):
    with pytest.raises(MissingResourceError) as info:
        _build("lab/not-there")
    text = str(info.value)
    assert "\n" not in text and "data.path='lab/not-there'" in text and "datasets--lab--not-there" in text
    assert "`hf download lab/not-there --repo-type dataset`" in text and "data.download: true" in text


@pytest.mark.parametrize("form", ["disk", "parquet"])
def test_config_keys_and_natural_partition(saved, hf_cache, form):
    cfg = load_config(
        str(CONF / "fedcgs_digits_tiny.yaml"),
        [
            *_by_writer(saved[form]),
            "--partition.num_clients",
            "3",
        ],
    )
    splits = build_dataset("hf", root=".", source=hf_source(cfg.data))
    parts = partition_for(cfg, splits.train_targets, splits.train_column)
    writers = splits.train_column("writer")
    assert [sorted(set(writers[p])) for p in parts] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    with pytest.raises(ConfigError, match=r"partition.num_clients=6 .* at most the 5 distinct values"):
        partition_for(
            load_config(
                str(CONF / "fedcgs_digits_tiny.yaml"),
                [
                    *_by_writer(saved["disk"]),
                    "--partition.num_clients",
                    "6",
                ],
            ),
            splits.train_targets,
            splits.train_column,
        )
    with pytest.raises(UsageError, match=r"partition.by='author' is not a column .* writer \(Value\)"):
        splits.train_column("author")


def test_a_natural_partition_that_groups_values_or_centralises_says_so(saved, hf_cache, tmp_path, capsys):
    """Never silent: K < V clients group the column's values, a column of one value is a centralised run."""
    groups = np.array(["b", "a", "c", "a"])
    assert natural_grouping_note(groups, 3, "w") is None  # one client per value: as asked, nothing to say
    assert "groups the 3 values of 'w' into 2 clients" in natural_grouping_note(groups, 2, "w")
    assert "--partition.num_clients 3" in natural_grouping_note(groups, 2, "w")
    assert "one client holds all the training data" in natural_grouping_note(np.array(["a", "a"]), 1, "w")
    cfg = load_config(
        str(CONF / "fedcgs_digits_tiny.yaml"),
        [
            *_by_writer(saved["disk"]),
            "--partition.num_clients",
            "3",
            "--output_dir",
            str(tmp_path),
        ],
    )
    sim = Simulation(cfg=cfg, loggers=[])
    sim.fabric.launch()
    sim._setup()
    assert "fl_lightning: partition.scheme natural groups the 5 values of 'writer' into 3 clients" in capsys.readouterr().err


def test_natural_clients_default_to_one_per_value_resolved_before_the_run(saved, hf_cache, tmp_path, capsys):
    """num_clients null: V = the column's distinct values, written into the config every reader sees (and the
    privacy's δ < 1/K checked against V); a number keeps its grouping; other schemes' null is 10 as before."""
    from fl_lightning.federation.num_clients import resolve_num_clients, resolve_runs

    natural = [
        *_by_writer(saved["disk"]),
        "--output_dir",
        str(tmp_path),
        "--partition.num_clients",
    ]
    cfg = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), [*natural, "null"])
    assert cfg.partition.num_clients is None
    resolved = resolve_num_clients(cfg)
    assert resolved.partition.num_clients == WRITERS and resolve_num_clients(resolved) is resolved
    assert [r.partition.num_clients for r in resolve_runs([cfg, cfg])] == [WRITERS, WRITERS]
    three = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), [*natural, "3"])
    assert resolve_num_clients(three) is three
    assert load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.num_clients", "null"]).partition.num_clients == 10
    # --print-config shows the config a run resolves; where the data cannot be read, null and one line saying why
    assert train.main(["--config", str(CONF / "fedcgs_digits_tiny.yaml"), *natural, "null", "--print-config"]) == 0
    assert f"  num_clients: {WRITERS}\n" in capsys.readouterr().out
    missing = [*natural[:3], str(tmp_path / "none"), *natural[4:], "null", "--print-config"]
    assert train.main(["--config", str(CONF / "fedcgs_digits_tiny.yaml"), *missing]) == 0
    out, err = capsys.readouterr()
    assert "  num_clients: null\n" in out and "partition.num_clients stays null here" in err and len(err.splitlines()) == 1
    sim = Simulation(cfg=cfg, loggers=[])
    assert sim.cfg.partition.num_clients == WRITERS  # before the attack, the availability and the checks read it
    sim.fabric.launch()
    _, env = sim._setup()
    assert len(env.partition) == WRITERS
    assert [sorted(set(env.splits.train_column("writer")[p])) for p in env.partition] == [[f"w{i}"] for i in range(5)]
    with pytest.raises(ConfigError, match=r"federation.privacy.delta.*1/num_clients = 0.2"):
        resolve_num_clients(
            load_config(
                str(CONF / "fedcgs_digits_tiny.yaml"),
                [
                    *natural,
                    "null",
                    "--federation.privacy.mechanism",
                    "dp_fedavg",
                    "--federation.privacy.delta",
                    "0.3",
                    "--federation.privacy.noise_multiplier",
                    "1.0",
                ],
            )
        )


def test_natural_needs_a_column_source():
    cfg = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.scheme", "natural", "--partition.by", "w"])
    with pytest.raises(ConfigError, match="natural needs data.name: hf"):
        partition_for(cfg, np.arange(20) % 3)
    with pytest.raises(ConfigError, match="partition.by=None"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--partition.scheme", "natural"])
    with pytest.raises(ConfigError, match="data.path=None"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", "hf"])


def test_natural_partition_one_client_per_value_and_grouped():
    groups = np.array(["b", "a", "c", "a", "d", "b"])
    assert [p.tolist() for p in natural_partition(groups, 4)] == [[1, 3], [0, 5], [2], [4]]
    assert [p.tolist() for p in natural_partition(groups, 3)] == [[0, 1, 3, 5], [2], [4]]


@pytest.mark.slow  # ~20 s on 2 cores: a whole CLI run (pytest -m slow, .ci/run)
def test_cli_run_on_a_parquet_folder_with_natural_clients(saved, tmp_path):
    """The whole path as a user runs it: the CLI, a parquet folder, natural clients, the partition report."""
    out = run_cli(
        "--config",
        str(CONF / "fedcgs_digits_tiny.yaml"),
        *_by_writer(saved["parquet"]),
        "--partition.num_clients",
        "null",
        "--output_dir",
        str(tmp_path / "runs"),  # null: one per writer
        "--run_name",
        "hf",
        "--logging.progress",
        "false",
        env={"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(saved["hub"])},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "runs" / "hf"
    meta = json.loads((run / "partition.json").read_text().split('"clients"')[0].rstrip(", ") + "}")["meta"]
    assert meta["scheme"] == "natural" and meta["by"] == "writer" and meta["path"] == str(saved["parquet"])
    assert (run / "partition.csv").is_file() and (run / "partition.png").is_file()
    assert json.loads((run / "summary.json").read_text())["num_clients"] == WRITERS
    assert list((tmp_path / "runs" / "feature_cache").glob("*.pt"))  # its key holds the data set's fingerprint


def test_the_package_imports_datasets_only_inside_functions():
    """``import fl_lightning`` (and any module of it) never imports ``datasets``: no module-level import of it."""
    import ast

    top = []
    for path in sorted((REPO / "fl_lightning").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            top += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("datasets", "flwr_datasets")]
    assert not top, top


def test_the_preflight_stops_a_missing_hub_id_before_anything_starts(hf_cache):
    from fl_lightning.preflight import check_data

    cfg = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", "hf", "--data.path", "lab/absent"])
    with pytest.raises(MissingResourceError, match=r"^data.path='lab/absent' is not in the Hugging Face cache"):
        check_data(cfg)
    check_data(
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", "hf", "--data.path", "lab/tiny-writers"])
    )  # cached: passes


@pytest.mark.parametrize("form", ["hub", "disk"])
def test_name_hf_colon_id_is_name_hf_with_path(saved, hf_cache, form):
    """``data.name: hf:<id>`` and ``name: hf`` + ``path: <id>``: one config, one data set, one fingerprint (the
    feature cache's key is made of the config's data keys and this fingerprint)."""
    target = "lab/tiny-writers" if form == "hub" else str(saved["disk"])
    short = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", f"hf:{target}"])
    long = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", "hf", "--data.path", target])
    assert short.data == long.data and short.data.name == "hf" and short.data.path == target
    assert short.resolved_run_name == long.resolved_run_name and "/" not in short.resolved_run_name
    same = load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", f"hf:{target}", "--data.path", target])
    assert same.data == long.data
    t = build_transform(normalization="imagenet", image_size=8, train=False)
    a = build_dataset(f"hf:{target}", root=".", train_transform=t, test_transform=t)  # the builder takes it too
    b = build_dataset("hf", root=".", source=hf_source(long.data), train_transform=t, test_transform=t)
    assert a.fingerprint == b.fingerprint and a.classes == b.classes
    np.testing.assert_array_equal(a.train_targets, b.train_targets)
    assert torch_equal(a.train[3][0], b.train[3][0])


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))


def test_hf_colon_with_nothing_after_it_is_one_line(saved, hf_cache):
    for name in ("hf:", "hf:  "):
        with pytest.raises(ConfigError) as info:
            load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", name])
        assert str(info.value) == (
            f"config error: data.name={name!r} is not allowed; expected hf:<hub id or local "
            "path> (e.g. hf:uoft-cs/cifar10), or name: hf with data.path"
        )
    with pytest.raises(
        ConfigError,
        match=r"^config error: data.path='lab/other' is not allowed; expected null or "
        r"'lab/tiny-writers': data.name 'hf:lab/tiny-writers' names the data set$",
    ):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", "hf:lab/tiny-writers", "--data.path", "lab/other"])
    with pytest.raises(ConfigError, match=r"^config error: data.name='hf:' is not allowed"):
        build_dataset("hf:", root=".")


def test_the_cli_says_hf_colon_alone_in_one_line_and_exits_2(tmp_path):
    out = run_cli("--config", str(CONF / "fedcgs_digits_tiny.yaml"), "--data.name", "hf:", "--output_dir", str(tmp_path))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "fl_lightning: config error: data.name='hf:' is not allowed; expected "
        "hf:<hub id or local path> (e.g. hf:uoft-cs/cifar10), or name: hf "
        "with data.path"
    ], out.stderr


@pytest.fixture
def versioned(saved, hf_cache):
    """``lab/versioned`` with two snapshots in the cache: main (the tiny data set) and tag v2 (labels shifted)."""
    repo = hf_cache / "datasets--lab--versioned"
    if not repo.exists():
        other = _tables()
        other["train"] = other["train"].map(lambda r: {"label": (r["label"] + 1) % 3})
        for commit, data in (("c" * 40, _tables()), ("d" * 40, other)):
            (repo / "snapshots" / commit / "data").mkdir(parents=True)
            for split in data:
                data[split].to_parquet(str(repo / "snapshots" / commit / "data" / f"{split}-00000-of-00001.parquet"))
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("c" * 40)
        (repo / "refs" / "v2").write_text("d" * 40)
    return "lab/versioned"


def test_data_revision_picks_the_hub_snapshot_and_enters_the_fingerprint(versioned):
    main = _build(versioned)
    v2 = _build(versioned, revision="v2")
    by_commit = _build(versioned, revision="d" * 40)
    np.testing.assert_array_equal(main.train_targets, np.arange(N_TRAIN) % 3)
    np.testing.assert_array_equal(v2.train_targets, (np.arange(N_TRAIN) + 1) % 3)
    np.testing.assert_array_equal(by_commit.train_targets, v2.train_targets)
    assert len({main.fingerprint, v2.fingerprint, by_commit.fingerprint}) == 3  # the revision is part of it
    assert _build(versioned, revision="main").fingerprint != main.fingerprint  # named, though the same snapshot
    assert _build(f"{versioned}@v2").fingerprint != main.fingerprint  # data.path org/name@rev reads v2 too
    np.testing.assert_array_equal(_build(f"{versioned}@v2").train_targets, v2.train_targets)


def test_a_revision_without_its_snapshot_and_a_revision_of_a_local_path_are_one_line(saved, versioned):
    with pytest.raises(MissingResourceError) as info:
        _build(versioned, revision="v9")
    text = str(info.value)
    assert "\n" not in text and text.startswith("data.path='lab/versioned' at revision 'v9' is not in the Hugging Face")
    assert "`hf download lab/versioned --repo-type dataset --revision v9`" in text
    with pytest.raises(
        ConfigError,
        match=r"^config error: data.revision='v2' is not allowed; expected null for the "
        r"local path '.*disk' \(a revision picks a snapshot of a hub id",
    ):
        _build(saved["disk"], revision="v2")
    with pytest.raises(UsageError, match=r"^config error: .*one revision: '@v2' in the id or the revision key 'v3'"):
        _build(f"{versioned}@v2", revision="v3")


def test_data_revision_in_the_config_and_the_preflight(saved, versioned):
    from fl_lightning.preflight import check_data

    def cfg(*extra):
        return load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", f"hf:{versioned}", *extra])

    assert cfg().data.revision is None and hf_source(cfg("--data.revision", "v2").data).revision == "v2"
    check_data(cfg("--data.revision", "v2"))
    with pytest.raises(MissingResourceError, match=r"^data.path='lab/versioned' at revision 'v9' is not in"):
        check_data(cfg("--data.revision", "v9"))
    with pytest.raises(ConfigError, match=r"data.revision='v2' is not allowed; expected null for the local path"):
        check_data(
            load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.name", f"hf:{saved['disk']}", "--data.revision", "v2"])
        )
    with pytest.raises(ConfigError, match=r"data.revision='v2' is not allowed; expected null, or a branch"):
        load_config(str(CONF / "fedcgs_digits_tiny.yaml"), ["--data.revision", "v2"])  # digits has no revisions
