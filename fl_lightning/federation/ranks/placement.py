"""Who runs where and who takes part: pure, seeded functions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "assign_clients",
    "deal_in_order",
    "sample_clients",
    "clients_per_round",
    "derive_seed",
    "seeded_uniform",
    "client_seed",
    "seed_torch",
]


def assign_clients(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Deal clients to ranks balanced by data size (longest-processing-time first).

    Clients are taken largest first and each goes to the rank with the least data so far (ties: the
    lower rank); within a rank, clients run in increasing index order. Deterministic.

    Returns:
        ``world_size`` sorted lists of client indices that partition ``range(len(sizes))``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [0] * world_size
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for client in sorted(range(len(sizes)), key=lambda c: (-sizes[c], c)):
        r = min(range(world_size), key=lambda i: (loads[i], i))
        ranks[r].append(client)
        loads[r] += sizes[client]
    return [sorted(r) for r in ranks]


def deal_in_order(clients: Sequence[int], sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Deal ``clients`` to ranks in contiguous blocks, in their order, the largest block's data as small as it can be.

    The linear partition problem: the smallest bound B on a block's data (``Σ sizes[c]`` over its clients) for which
    filling each block in order up to B needs at most ``world_size`` blocks (a binary search over B: filling up to B
    needs the fewest blocks any partition under B needs), then each block filled up to it. Rank r gets block r, so
    rank 0 holds the first clients and rank r's clients all come after rank r−1's — what lets the ranks fold their
    clients' uploads in client order, each on the sum the rank before it carries (federation/ranks/summed_uploads.py).
    Ranks past the last block get none. Deterministic.

    Returns:
        ``world_size`` lists whose concatenation is ``list(clients)``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads = [int(sizes[c]) for c in clients]
    lo, hi = max(loads, default=0), sum(loads)
    while lo < hi:
        bound = (lo + hi) // 2
        if len(_filled(loads, bound)) <= world_size:
            hi = bound
        else:
            lo = bound + 1
    blocks = [[clients[i] for i in block] for block in _filled(loads, lo)]
    return blocks + [[] for _ in range(world_size - len(blocks))]


def _filled(loads: Sequence[int], bound: int) -> list[list[int]]:
    """Positions 0..len(loads)−1 in blocks filled in order, a new block whenever the next load would pass ``bound``."""
    blocks: list[list[int]] = []
    total = 0
    for i, load in enumerate(loads):
        if not blocks or total + load > bound:
            blocks.append([])
            total = 0
        blocks[-1].append(i)
        total += load
    return blocks


def clients_per_round(num_clients: int, fraction: float) -> int:
    """How many clients a round samples: all of them at ``fraction`` 1, else ``max(1, round(fraction·K))``."""
    return num_clients if fraction >= 1.0 else max(1, int(round(fraction * num_clients)))


def sample_clients(num_clients: int, fraction: float, *, seed: int, round_idx: int) -> list[int]:
    """The clients taking part in a round: ``max(1, round(fraction·K))`` of them, without replacement.

    The draw depends only on (seed, round_idx), so a resumed run samples the same clients.
    """
    if fraction >= 1.0:
        return list(range(num_clients))
    m = clients_per_round(num_clients, fraction)
    rng = np.random.default_rng([seed, round_idx])
    return sorted(int(c) for c in rng.choice(num_clients, size=m, replace=False))


def derive_seed(*keys: int) -> int:
    """One 32-bit seed derived from a run seed and the indices that name a piece of work (numpy's
    ``SeedSequence``: independent streams for distinct keys, the same seed wherever the work runs)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])


def seeded_uniform(seed: int, round_idx: int, client: int, tag: int) -> float:
    """One uniform draw in [0, 1) from (``seed``, round, client, ``tag``): a client's coin for one kind of event
    (``tag`` keeps the kinds apart), the same on every rank and after a resume."""
    return float(np.random.default_rng(derive_seed(seed, round_idx, client, tag)).random())


def client_seed(seed: int, round_idx: int, client: int) -> int:
    """A per-(round, client) seed: a client's randomness is independent of which rank runs it."""
    return derive_seed(seed, round_idx, client)


def seed_torch(seed: int, device: torch.device) -> None:
    """Seed torch's generators for work on ``device``: what ``torch.manual_seed(seed)`` does for that run.

    ``torch.manual_seed`` also queues a seed for every accelerator type torch knows (CUDA, XPU, MTIA) and
    records a Python stack for each while they are uninitialised: ~1 ms per call on a CPU run, paid per
    client. A rank computes on one device, so seeding the CPU generator and that device's is the same.
    """
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the rank's current device (initialised: no queued call)
    elif device.type != "cpu":
        torch.manual_seed(seed)  # any other accelerator: torch's own route
