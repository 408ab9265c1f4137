"""The loader settings (auto resolved by one pure function) and the loader kept for the run: the same batches as
the per-client seeded DataLoader of before, with 0 and 2 workers, epoch after epoch, client after client."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from fl_lightning.config.history import added_key_overrides, recorded_config
from fl_lightning.config.loading import config_to_dict, load_config
from fl_lightning.data.loader import ClientPasses, LoaderSettings, TensorBatches, resolve_loader_settings
from fl_lightning.data.preprocessed import PreprocessedSplit, collate
from fl_lightning.data.relabelled import Relabelled
from fl_lightning.errors import ConfigError, ResourceError
from fl_lightning.federation.algorithm import Environment
from fl_lightning.federation.storage.run_folder import config_diff
from fl_lightning.preflight import check_devices


@pytest.mark.parametrize(
    "given, cuda, cpus, ranks, expected",
    [
        (("auto", "auto", "auto"), False, 64, 1, (0, False, False)),  # the CPU: the rank loads itself
        (("auto", "auto", "auto"), True, 16, 1, (4, True, True)),  # capped at 4 per rank
        (("auto", "auto", "auto"), True, 16, 8, (1, True, True)),  # 2 cores a rank: one for the rank, one worker
        (("auto", "auto", "auto"), True, 8, 8, (0, True, False)),  # one core a rank: no worker, so none persists
        (("auto", "auto", "auto"), True, 1, 4, (0, True, False)),
        ((2, False, "auto"), True, 16, 1, (2, False, True)),  # explicit values are kept
        ((3, "auto", False), False, 2, 1, (3, False, False)),
        ((0, True, True), True, 16, 1, (0, True, False)),  # DataLoader refuses persistent workers without workers
    ],
)
def test_resolve_loader_settings(given, cuda, cpus, ranks, expected):
    assert resolve_loader_settings(*given, cuda=cuda, cpus=cpus, ranks_on_node=ranks) == LoaderSettings(*expected)


def test_config_keys_accept_auto_and_refuse_nonsense():
    cfg = load_config(None, [])
    assert (cfg.data.num_workers, cfg.data.pin_memory, cfg.data.persistent_workers) == ("auto", "auto", "auto")
    assert load_config(None, ["--data.num_workers", "2", "--data.pin_memory", "false"]).data.num_workers == 2
    for key, value in (
        ("num_workers", "many"),
        ("num_workers", "-1"),
        ("num_workers", "true"),
        ("pin_memory", "often"),
        ("normalize_on_device", "gpu"),
        ("cache_uint8_mb", "-1"),
    ):
        with pytest.raises(ConfigError, match=key):
            load_config(None, [f"--data.{key}", value])


def test_preflight_checks_the_resolved_worker_count():
    check_devices(load_config(None, ["--federation.accelerator", "cpu"]), cpus=1, gpus=0, memory=None)  # auto: 0
    with pytest.raises(ResourceError, match="data.num_workers=3"):
        check_devices(
            load_config(None, ["--federation.accelerator", "cpu", "--data.num_workers", "3"]), cpus=2, gpus=0, memory=None
        )


def test_a_run_recorded_before_the_keys_resumes():
    now = config_to_dict(load_config(None, []))
    before = {
        **now,
        "data": {
            k: v
            for k, v in now["data"].items()
            if k not in ("pin_memory", "persistent_workers", "normalize_on_device", "cache_uint8_mb")
        },
    }
    before["data"]["num_workers"] = 0  # as every run before `auto` recorded it
    assert recorded_config(before)["data"]["cache_uint8_mb"] == 0  # how it ran: no uint8 cache
    pinned = added_key_overrides(before)
    assert pinned[pinned.index("--data.pin_memory") + 1] == "false"
    resumed = config_to_dict(load_config(None, [*pinned, "--data.num_workers", "0"]))  # config.yaml pins 0
    assert config_diff(recorded_config(before), resumed) == []
    # the loader's speed-only keys may change on resume
    faster = config_to_dict(
        load_config(
            None,
            [
                *pinned,
                "--data.num_workers",
                "0",
                "--data.pin_memory",
                "true",
                "--data.cache_uint8_mb",
                "64",
                "--data.normalize_on_device",
                "true",
            ],
        )
    )
    assert config_diff(recorded_config(before), faster) == []


class _Items(Dataset):
    """Distinct items (their own index in every value), read in batches as the registry's splits are."""

    def __init__(self, n: int) -> None:
        self.x = torch.arange(n * 6, dtype=torch.float32).reshape(n, 6) / 7

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i].clone(), int(i) % 5


def _old(train: Dataset, rows: list[int], *, shuffle: bool, seed: int, batch_size: int, workers: int):
    g = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(
        Subset(train, rows),
        batch_size=batch_size,
        shuffle=shuffle,
        generator=g,
        num_workers=workers,
        persistent_workers=False,
        collate_fn=collate,
    )


def _batches(loader, epochs: int) -> list:
    return [b for _ in range(epochs) for b in loader]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[0].dtype == y[0].dtype for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cached", [False, True])
def test_one_loader_gives_the_per_client_loaders_batches(workers, cached):
    train = _Items(53)
    if cached:
        train = PreprocessedSplit(train, budget_bytes=1 << 20)
    clients = [(list(range(0, 53, 3)), 11), (list(range(1, 40)), 12), ([5], 13), (list(range(52, 20, -2)), 14)]
    passes = ClientPasses(train, num_workers=workers, pin_memory=False, persistent_workers=workers > 0, collate_fn=collate)
    for shuffle in (True, False):
        for rows, seed in clients:
            old = _batches(_old(train, rows, shuffle=shuffle, seed=seed, batch_size=4, workers=workers), epochs=2)
            one = passes.pass_over(rows, batch_size=4, shuffle=shuffle, seed=seed)
            assert len(one) == len(old) // 2
            assert _same(_batches(one, epochs=2), old)
    # a pass stopped after one batch leaves nothing behind for the next client
    rows, seed = clients[1]
    next(iter(passes.pass_over(clients[0][0], batch_size=4, shuffle=True, seed=1)))
    assert _same(
        _batches(passes.pass_over(rows, batch_size=4, shuffle=True, seed=seed), 1),
        _batches(_old(train, rows, shuffle=True, seed=seed, batch_size=4, workers=0), 1),
    )
    if workers:
        assert passes.loader._iterator is not None and passes.loader._iterator._workers  # started once, kept


def test_environment_keeps_one_loader_for_the_training_split():
    train = _Items(30)
    cfg = SimpleNamespace(data=SimpleNamespace(batch_size=4), federation=SimpleNamespace(devices=1))
    splits = SimpleNamespace(train=train, test=_Items(10))
    env = Environment(
        SimpleNamespace(), cfg, splits, [], Path("."), loading=LoaderSettings(2, False, True), one_train_loader=True
    )
    a = env.loader(Subset(train, [3, 1, 4, 1, 5, 9, 2, 6]), shuffle=True, seed=7)
    b = env.loader(Subset(train, list(range(20))), shuffle=True, seed=8, batch_size=3)
    assert a.passes is b.passes  # one loader: its workers serve every client
    assert _same(list(b), list(_old(train, list(range(20)), shuffle=True, seed=8, batch_size=3, workers=0)))
    assert isinstance(env.loader(Subset(train, [0, 1]), shuffle=False), type(a))
    assert isinstance(env.loader(train, shuffle=False), DataLoader)  # not a client's rows: as before
    # a label flipper's rows: read through the same loader, its labels mapped after the workers
    rows, reverse = list(range(3, 25)), [4, 3, 2, 1, 0]
    flipped = env.loader(Relabelled(Subset(train, rows), reverse), shuffle=True, seed=9)
    assert flipped.loader.passes is a.passes
    expected = [[x, torch.as_tensor(reverse)[y]] for x, y in _old(train, rows, shuffle=True, seed=9, batch_size=4, workers=0)]
    assert _same(list(flipped), expected) and len(flipped) == len(expected)
    env = Environment(
        SimpleNamespace(), cfg, splits, [], Path("."), loading=LoaderSettings(2, False, True), one_train_loader=False
    )  # an augmented split: the per-client loader, as before
    assert isinstance(env.loader(Subset(train, [0, 1]), shuffle=True, seed=1), DataLoader)


@pytest.mark.parametrize("shuffle", [True, False])
def test_tensor_batches_are_the_seeded_dataloaders(shuffle):
    """FedAvg of a head: its feature rows gathered per batch where they lie, the DataLoader's batches exactly."""
    from torch.utils.data import TensorDataset

    h, y = torch.randn(23, 5), torch.arange(23) % 4
    for seed in (0, 7):
        g = torch.Generator().manual_seed(seed) if shuffle else None
        old = _batches(DataLoader(TensorDataset(h, y), batch_size=4, shuffle=shuffle, generator=g), epochs=2)
        new = TensorBatches(h, y, batch_size=4, shuffle=shuffle, seed=seed)
        assert len(new) == 6 and _same(_batches(new, epochs=2), old)
    with pytest.raises(ValueError, match="one length"):
        TensorBatches(h, y[:3], batch_size=4, shuffle=True)


# --------------------------------------------------------------------------------- cores per rank and per job
@pytest.mark.parametrize(
    "environ, ranks, cpus, sharing",
    [
        ({}, 4, 32, 4),  # Fabric's launcher / torchrun: the ranks share the node's mask
        ({"SLURM_PROCID": "3", "SLURM_CPUS_PER_TASK": "8", "SLURM_STEP_TASKS_PER_NODE": "4"}, 4, 8, 1),  # srun: its own
        ({"SLURM_PROCID": "0", "SLURM_CPUS_PER_TASK": "8", "SLURM_TASKS_PER_NODE": "4(x2)"}, 4, 8, 1),
        ({"SLURM_PROCID": "0", "SLURM_CPUS_PER_TASK": "32", "SLURM_TASKS_PER_NODE": "1"}, 4, 32, 4),  # one task, 4 ranks
        ({"SLURM_PROCID": "0", "SLURM_CPUS_PER_TASK": "8", "SLURM_TASKS_PER_NODE": "4"}, 4, 32, 4),  # no binding
        ({"SLURM_PROCID": "0", "SLURM_CPUS_PER_TASK": "x", "SLURM_TASKS_PER_NODE": "4"}, 4, 8, 4),
    ],
    ids=["launcher", "srun step", "srun job", "one task", "unbound", "garbage"],
)
def test_auto_workers_count_a_slurm_tasks_own_cores_once(environ, ranks, cpus, sharing):
    from fl_lightning.cores import ranks_sharing_cores

    assert ranks_sharing_cores(ranks, cpus, environ) == sharing
    settings = resolve_loader_settings("auto", "auto", "auto", cuda=True, cpus=cpus, ranks_on_node=sharing)
    if environ.get("SLURM_CPUS_PER_TASK") == "8" and sharing == 1:
        assert settings.num_workers == 4  # min(AUTO_MAX_WORKERS, its 8 cores less its own process); was 8 // 4 - 1


def test_jobs_get_disjoint_cores_of_their_own():
    import subprocess
    import sys

    from fl_lightning.cores import core_shares
    from fl_lightning.experiments.runner import _pinned_to

    assert core_shares(range(8), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert core_shares([4, 5], 3) == [[4], [5], [4]]  # more jobs than cores: each still gets one
    cores = sorted(os.sched_getaffinity(0))[:1]
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        preexec_fn=_pinned_to(cores),
        check=True,
    ).stdout
    assert out.strip() == str(cores)
    assert _pinned_to(None) is None


def test_each_evaluation_reads_the_store_the_first_one_filled():
    """The rank primes a split's store before its loader's workers start: a later evaluation's new workers decode
    nothing again."""
    from tests.data.test_preprocessed import _Decodes

    test = _Decodes(30)
    cfg = SimpleNamespace(data=SimpleNamespace(batch_size=4), federation=SimpleNamespace(devices=1))
    splits = SimpleNamespace(train=test, test=PreprocessedSplit(test, budget_bytes=1 << 20))
    env = Environment(SimpleNamespace(), cfg, splits, [], Path("."), loading=LoaderSettings(2, False, False))
    first, again = (list(env.loader(env.splits.test, shuffle=False)) for _ in range(2))
    assert test.decodes.tolist() == [1] * 30 and splits.test.shared
    assert _same(first, again) and torch.equal(torch.cat([b[0] for b in first]), test.x)


def test_every_evaluation_reads_through_one_loader_whose_workers_stay():
    """The test split (and a rank's block of it) is read through a loader kept for the run: the same batches as a
    fresh unshuffled DataLoader, from workers started once."""
    train, test = _Items(12), _Items(30)
    cfg = SimpleNamespace(data=SimpleNamespace(batch_size=4), federation=SimpleNamespace(devices=1))
    env = Environment(
        SimpleNamespace(), cfg, SimpleNamespace(train=train, test=test), [], Path("."), loading=LoaderSettings(2, False, True)
    )
    whole, block = env.loader(test, shuffle=False), env.loader(Subset(test, list(range(8, 20))), shuffle=False)
    assert whole.passes is block.passes
    assert _same(list(whole), list(DataLoader(test, batch_size=4, collate_fn=collate)))
    workers = [w.pid for w in whole.passes.loader._iterator._workers]
    assert _same(list(block), list(_old(test, list(range(8, 20)), shuffle=False, seed=0, batch_size=4, workers=0)))
    assert [w.pid for w in whole.passes.loader._iterator._workers] == workers  # not started again
    assert isinstance(env.loader(Subset(test, [1, 2]), shuffle=True, seed=3), DataLoader)  # shuffled: as before
    assert isinstance(env.loader(train, shuffle=False), DataLoader)  # the whole training split: as before
