import itertools

import numpy as np
import pytest
import torch

from fl_lightning.federation.ranks.placement import assign_clients, client_seed, sample_clients


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_assignment_partitions_clients_and_balances_data(world):
    sizes = np.random.default_rng(0).integers(1, 500, size=23).tolist()
    ranks = assign_clients(sizes, world)
    assert sorted(itertools.chain(*ranks)) == list(range(23))
    loads = [sum(sizes[c] for c in r) for r in ranks]
    # LPT guarantee: max load <= mean load + largest job
    assert max(loads) <= sum(sizes) / world + max(sizes)


def test_assignment_beats_round_robin_on_skewed_sizes():
    sizes = [1000, 1, 1000, 1, 1, 1]
    lpt = [sum(sizes[c] for c in r) for r in assign_clients(sizes, 2)]
    rr = [sum(sizes[c] for c in range(r, len(sizes), 2)) for r in range(2)]
    assert max(lpt) < max(rr)


def test_sampling_depends_only_on_seed_and_round():
    a = sample_clients(100, 0.1, seed=3, round_idx=5)
    assert a == sample_clients(100, 0.1, seed=3, round_idx=5) and len(a) == 10 == len(set(a))
    assert a != sample_clients(100, 0.1, seed=3, round_idx=6)
    assert sample_clients(7, 1.0, seed=0, round_idx=0) == list(range(7))
    assert len(sample_clients(7, 0.01, seed=0, round_idx=0)) == 1


def test_client_seed_distinct():
    seeds = {client_seed(0, r, c) for r in range(5) for c in range(50)}
    assert len(seeds) == 250


def test_seed_torch_draws_what_torch_manual_seed_draws_on_cpu():
    from fl_lightning.federation.ranks.placement import seed_torch

    torch.manual_seed(1234)
    expected = (torch.rand(5), torch.randn(3, 2), torch.randint(0, 10, (4,)))
    torch.manual_seed(0)  # a different state first: seed_torch must reset it fully
    seed_torch(1234, torch.device("cpu"))
    got = (torch.rand(5), torch.randn(3, 2), torch.randint(0, 10, (4,)))
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
