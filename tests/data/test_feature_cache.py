"""Frozen features once per comparison: the table on disk, its key, and the methods that read it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from fl_lightning.config.loading import load_config
from fl_lightning.data.feature_cache import FeatureCache, accelerator_name, cache_key, split_features, state_dict_digest
from fl_lightning.errors import ConfigError
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from fl_lightning.models.backbones import ViTBackbone
from tests.conftest import CONF


# -- the table and its key ---------------------------------------------------------------------------
def _table(n: int = 10, d: int = 4) -> torch.Tensor:
    return torch.arange(n * d, dtype=torch.float32).reshape(n, d)


def test_second_get_reads_the_file_and_a_corrupt_or_foreign_file_is_recomputed(tmp_path):
    cache, calls = FeatureCache(tmp_path), []

    def compute():
        calls.append(1)
        return _table()

    first = cache.get("k", rows=10, compute=compute)
    assert torch.equal(cache.get("k", rows=10, compute=compute), first) and len(calls) == 1 and cache.hits == 1
    path = cache.path("k")
    path.write_bytes(path.read_bytes()[:100])  # torn
    assert cache.load("k", rows=10) is None
    assert torch.equal(cache.get("k", rows=10, compute=compute), first) and len(calls) == 2
    assert cache.load("k", rows=10) is not None  # replaced by a whole file
    cache.store("other", _table() + 1)  # another key's table under this key's name
    path.write_bytes(cache.path("other").read_bytes())
    assert cache.load("k", rows=10) is None
    assert cache.load("other", rows=9) is None  # not the split's row count
    record = safe_load(cache.path("other"))
    record["features"][0, 0] = -1.0  # a changed value: the checksum no longer matches
    torch.save(record, cache.path("other"))
    assert cache.load("other", rows=10) is None


def test_no_folder_computes_every_time(tmp_path):
    cache, calls = FeatureCache(None), []
    for _ in range(2):
        cache.get("k", rows=10, compute=lambda: calls.append(1) or _table())
    assert len(calls) == 2 and not any(tmp_path.iterdir())


def test_key_follows_weights_class_and_description():
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    assert state_dict_digest(a) != state_dict_digest(b)
    b.load_state_dict(a.state_dict())
    desc = {"transform": "Resize(32)", "dataset": {"name": "digits", "rows": 10}}
    assert cache_key(a, desc) == cache_key(b, desc)
    assert cache_key(a, desc) != cache_key(a, {**desc, "transform": "Resize(56)"})
    assert cache_key(a, desc) != cache_key(a, {**desc, "dataset": {"name": "digits", "rows": 9}})
    assert cache_key(a, desc) != cache_key(nn.Sequential(a), desc)  # another module, the same tensors inside
    bn = nn.BatchNorm1d(3)  # a CNN backbone's state dict holds 0-dim buffers (num_batches_tracked)
    before = state_dict_digest(bn)
    bn.num_batches_tracked += 1
    assert state_dict_digest(bn) != before


def test_the_key_names_the_gpu_not_only_cuda(monkeypatch):
    """Two GPU models pick other kernels (other round-off): their tables must not share a key."""
    names = iter(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: next(names))
    h100, a100 = accelerator_name("cuda:0"), accelerator_name(torch.device("cuda", 1))
    assert (h100, a100) == ("cuda:NVIDIA H100 80GB HBM3", "cuda:NVIDIA A100-SXM4-80GB")
    assert accelerator_name("cpu") == "cpu"
    a = nn.Linear(3, 2)
    assert cache_key(a, {"device": h100}) != cache_key(a, {"device": a100})


def test_split_features_are_the_split_in_order_in_fixed_batches():
    x = torch.randn(10, 3, 2, 2)
    ds = TensorDataset(x, torch.zeros(10, dtype=torch.int64))
    seen = []

    def fn(images):
        seen.append(images.shape[0])
        return images.flatten(1)[:, :2]

    assert torch.equal(split_features(fn, ds, batch_size=4, device="cpu"), x.flatten(1)[:, :2])
    assert seen == [4, 4, 2]


# -- the methods ------------------------------------------------------------------------------------
_TINY = {
    "afl": "fedopal_digits_tiny.yaml",
    "fedcgs": "fedcgs_digits_tiny.yaml",
    "fedpft": "fedpft_digits_tiny.yaml",
    "fedavg": "fedavg_digits_tiny.yaml",
}


class _Forwards:
    """Counts the images that go through any frozen backbone (a global forward hook)."""

    def __enter__(self):
        self.images = 0

        def hook(module, args, output):
            if isinstance(module, ViTBackbone):
                self.images += int(args[0].shape[0])

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _run(out, method, *extra):
    cfg = load_config(
        CONF / _TINY[method],
        [
            "--algorithm",
            method,
            "--output_dir",
            str(out),
            "--logging.progress",
            "false",
            "--partition.num_clients",
            "3",
            "--data.num_samples",
            "300",
            "--federation.rounds",
            "1",
            *extra,
        ],
    )
    with _Forwards() as forwards:
        summary = Simulation(cfg=cfg, loggers=[]).run()
    return summary, safe_load(cfg.run_dir / "checkpoints" / "server.pt")["state"], forwards.images


def _same(a, b):
    (s1, w1, _), (s2, w2, _) = a, b
    assert s1["accuracy"] == s2["accuracy"] and s1["loss"] == s2["loss"]
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.parametrize("method", ["afl", "fedcgs", "fedpft", "fedavg"])
def test_results_are_bit_identical_with_and_without_the_cache(tmp_path, method):
    cached = _run(tmp_path / "on", method)
    assert cached[2] > 0 and any((tmp_path / "on" / "feature_cache").iterdir())
    off = _run(tmp_path / "off", method, "--data.feature_cache", "false")
    assert not (tmp_path / "off" / "feature_cache").exists()
    _same(cached, off)
    again = _run(tmp_path / "on", method, "--run_name", "again")  # another run of the comparison
    assert again[2] == 0  # no image went through the backbone: both splits were read
    _same(cached, again)


def test_a_run_with_another_key_computes_its_own_features(tmp_path):
    base = _run(tmp_path, "fedcgs", "--data.split_seed", "0")
    n_train_test, tables = base[2], sorted((tmp_path / "feature_cache").iterdir())  # train and test
    assert len(tables) == 2
    other_alpha = _run(tmp_path, "fedcgs", "--data.split_seed", "0", "--partition.alpha", "10", "--seed", "0")
    assert other_alpha[2] == 0  # the same images and weights: shared
    for extra in (
        ["--seed", "1"],  # other random weights (the same split: data.split_seed)
        ["--data.image_size", "24", "--model.overrides.img_size", "24"],  # another transform
        ["--data.num_samples", "250"],
    ):  # another subset
        assert _run(tmp_path, "fedcgs", "--data.split_seed", "0", *extra)[2] > 0, extra
    tables[0].write_bytes(b"not a table")
    rerun = _run(tmp_path, "fedcgs", "--data.split_seed", "0", "--run_name", "rerun")
    assert 0 < rerun[2] < n_train_test  # the torn table is recomputed; the other split still read
    _same(base, rerun)


def test_prompt_methods_do_not_use_the_cache(tmp_path):
    cfg = load_config(
        CONF / "fedopal_digits_tiny.yaml",
        [
            "--output_dir",
            str(tmp_path),
            "--logging.progress",
            "false",
            "--partition.num_clients",
            "2",
            "--data.num_samples",
            "100",
            "--train.epochs",
            "0",
        ],
    )
    Simulation(cfg=cfg, loggers=[]).run()
    assert not (tmp_path / "feature_cache").exists()


def test_an_empty_folder_name_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="data.feature_cache"):
        load_config(CONF / "fedcgs_digits_tiny.yaml", ["--data.feature_cache", " "])


def test_split_seed_fixes_the_data_split_whatever_the_run_seed():
    cfg = load_config(CONF / "fedcgs_digits_tiny.yaml", ["--seed", "3"])
    assert cfg.data_seed == 3
    assert load_config(CONF / "fedcgs_digits_tiny.yaml", ["--seed", "3", "--data.split_seed", "0"]).data_seed == 0
