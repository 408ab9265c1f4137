"""The two deals of work over ranks against brute force, and each site's former index expression, for many (n, W)."""

from __future__ import annotations

import math

import pytest

from fl_lightning.dealing import Deal

PAIRS = [(n, world) for n in (*range(0, 20), 37, 100, 101, 257) for world in (1, 2, 3, 4, 5, 7, 8, 16, 33)]


def _owners_by_blocks(n: int, world: int) -> list[int]:
    """Brute force: item i belongs to the last rank whose block starts at or before it; rank r's block starts at or
    before i when ⌊n·r/W⌋ ≤ i, i.e. n·r/W < i + 1, i.e. n·r < (i + 1)·W (exact integers, no floor division)."""
    return [max(r for r in range(world) if n * r < (i + 1) * world) for i in range(n)]


@pytest.mark.parametrize("n,world", PAIRS)
def test_blocks_deal_every_item_once_contiguous_balanced_in_order(n, world):
    shares = [Deal(r, world).blocks(n) for r in range(world)]
    assert [i for s in shares for i in s] == list(range(n))  # every item once, in rank order
    assert all(s.step == 1 for s in shares)  # contiguous
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced within one
    owners = _owners_by_blocks(n, world)
    assert all(owners[i] == r for r, s in enumerate(shares) for i in s)
    assert all(len(s) in (n // world, math.ceil(n / world)) for s in shares)


@pytest.mark.parametrize("n,world", PAIRS)
def test_strided_deals_item_i_to_rank_i_mod_world(n, world):
    shares = [Deal(r, world).strided(n) for r in range(world)]
    assert sorted(i for s in shares for i in s) == list(range(n))
    assert all(i % world == r for r, s in enumerate(shares) for i in s)
    assert all(list(s) == sorted(s) for s in shares)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("n,world", PAIRS)
def test_each_site_gets_its_former_indices(n, world):
    """Bit-identical to the expressions each site wrote out before it named its rule."""
    items = [f"item{i}" for i in range(n)]
    for r in range(world):
        deal = Deal(r, world)
        assert deal.blocks(n) == range(n * r // world, n * (r + 1) // world)  # the store's rows
        assert deal.blocks(n) == range(r * n // world, (r + 1) * n // world)  # the split ensemble's teachers
        assert [items[i] for i in deal.strided(n)] == items[r::world]  # pre-training rows, pilots, --shard shares
        assert list(deal.strided(n)) == list(range(r, n, world))  # generation batches


@pytest.mark.parametrize("n,world", PAIRS)
def test_the_inverses_put_every_rank_part_back_in_item_order(n, world):
    items = [(i, f"x{i}") for i in range(n)]
    by_blocks = [[items[i] for i in Deal(r, world).blocks(n)] for r in range(world)]
    by_turns = [[items[i] for i in Deal(r, world).strided(n)] for r in range(world)]
    assert Deal.unblock(by_blocks) == items
    assert Deal.unstride(by_turns) == items
    assert Deal.unstride(by_turns) == [by_turns[i % world][i // world] for i in range(n)]  # the pilots' former line


def test_a_part_of_the_wrong_length_and_a_rank_outside_the_world_are_one_line():
    with pytest.raises(ValueError, match=r"parts of \[3, 1\] items are not a strided deal of 4 over 2 ranks \(\[2, 2\]\)"):
        Deal.unstride([[0, 2, 4], [1]])  # a rank that ran one pilot too many
    with pytest.raises(ValueError, match="not a blocks deal"):
        Deal.unblock([[0], [1, 2, 3]])
    with pytest.raises(ValueError, match="no parts"):
        Deal.unblock([])
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\], got 3"):
        Deal(3, 3)
    with pytest.raises(ValueError, match="world must be"):
        Deal(0, 0)
    with pytest.raises(ValueError, match="items must be >= 0"):
        Deal(0, 2).blocks(-1)


def test_of_reads_a_fabric_rank_and_world():
    class _Fabric:
        global_rank, world_size = 2, 5

    assert Deal.of(_Fabric()) == Deal(2, 5)
