"""Per-client state on disk (fl_lightning/federation/storage/client_state.py): a value written in round r is read from round
r + 1 on, never in round r itself, so a round redone after a kill reads what the committed rounds left; checked
against a dictionary model of committed values over random schedules with aborted rounds."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.federation.storage.client_state import ClientStateStore


def test_a_value_is_read_from_the_round_after_the_one_that_wrote_it(tmp_path):
    store = ClientStateStore(tmp_path / "s", num_clients=3, numel=5)
    assert not store.read(1, 0).any() and not (tmp_path / "s").exists()  # nothing written: zeros, no file
    store.write({1: np.arange(5.0)}, round_idx=0)
    assert not store.read(1, 0).any()  # round 0 redone: still what came before it
    assert np.array_equal(store.read(1, 1), np.arange(5.0)) and np.array_equal(store.read(1, 7), np.arange(5.0))
    assert not store.read(0, 1).any() and store.read(1, 1).dtype == np.float32


def test_an_aborted_rounds_write_never_reaches_the_committed_value(tmp_path):
    store = ClientStateStore(tmp_path / "s", num_clients=2, numel=3)
    store.write({0: np.full(3, 1.0)}, 0)
    store.write({0: np.full(3, 2.0)}, 2)  # round 2's first attempt, killed before server.pt
    store.write({0: np.full(3, 3.0)}, 2)  # redone: the value as of round 2 is still round 0's
    assert np.array_equal(store.read(0, 2), np.full(3, 1.0)) and np.array_equal(store.read(0, 3), np.full(3, 3.0))
    # a kill between a value and its stamp: the slot not read holds half a value, unstamped
    values = np.load(store.folder / "values.npy", mmap_mode="r+")
    values[0, :, :3] = np.where(np.load(store.folder / "rounds.npy")[0][:, None] == 2, values[0, :, :3], np.nan)
    values.flush()
    assert np.array_equal(store.read(0, 3), np.full(3, 3.0))


def test_random_schedules_with_aborted_rounds_read_the_committed_values(tmp_path):
    rng = np.random.default_rng(0)
    n, p = 6, 1100  # a row of two pages
    store = ClientStateStore(tmp_path / "s", num_clients=n, numel=p)
    committed: dict[int, np.ndarray] = {}  # the values the committed rounds left (the model)
    for round_idx in range(40):
        for attempt in range(int(rng.integers(1, 4))):  # 0–2 aborted attempts, then the one that commits
            clients = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
            for c in range(n):  # every read in the round sees the committed values, whatever was aborted
                expected = committed.get(c, np.zeros(p, np.float32))
                assert np.array_equal(store.read(c, round_idx), expected), (round_idx, attempt, c)
            new = {int(c): rng.standard_normal(p).astype(np.float32) for c in clients}
            store.write(new, round_idx)
        committed.update(new)


def test_ten_thousand_clients_keep_a_flat_per_client_cost(tmp_path):
    store = ClientStateStore(tmp_path / "s", num_clients=10_000, numel=1_000)  # a 100-d head on 10 classes: 82 MB
    store.write({9_999: np.ones(1_000), 0: np.full(1_000, 2.0)}, 0)
    assert (store.folder / "values.npy").stat().st_size >= 10_000 * 2 * 1_024 * 4  # a whole page per slot
    assert np.array_equal(store.read(9_999, 1), np.ones(1_000)) and not store.read(5_000, 1).any()
    store.clear()
    assert not store.folder.exists()


@pytest.mark.parametrize("numel", [1, 1024, 1025])
def test_rows_are_whole_pages(tmp_path, numel):
    store = ClientStateStore(tmp_path / "s", num_clients=2, numel=numel)
    store.write({1: np.ones(numel)}, 0)
    width = np.load(store.folder / "values.npy", mmap_mode="r").shape[-1]
    assert width % 1024 == 0 and width >= numel
