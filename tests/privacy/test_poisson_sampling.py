"""DP-SGD's Poisson lots: each record in each step's lot independently with probability q (the sampling the
accountant credits), empty lots kept as steps, the same draws from the same generator, a fresh epoch each pass."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from fl_lightning.privacy.poisson_sampling import PoissonBatches, poisson_batches


def test_each_record_is_in_each_lot_independently_with_probability_q():
    n, q, steps = 50, 0.1, 2000
    lots = poisson_batches(n, q, steps, torch.Generator().manual_seed(0))
    membership = torch.zeros(steps, n)
    for t, lot in enumerate(lots):
        membership[t, lot] = 1
        assert lot == sorted(set(lot)) and all(0 <= i < n for i in lot)
    # every record's count of lots is Binomial(steps, q): a two-sided test per record, Bonferroni over records
    for count in membership.sum(0).tolist():
        assert stats.binomtest(int(count), steps, q).pvalue > 0.01 / n
    # lot sizes are Binomial(n, q): about (1-q)^n of them empty, and the sizes vary (not a fixed batch)
    sizes = membership.sum(1)
    empty = int((sizes == 0).sum())
    assert stats.binomtest(empty, steps, (1 - q) ** n).pvalue > 1e-3 and sizes.std() > 1
    # two records' memberships are uncorrelated
    assert abs(float(torch.corrcoef(membership[:, :2].T)[0, 1])) < 4 / steps**0.5


def test_the_same_generator_state_draws_the_same_lots_and_a_new_epoch_draws_new_ones():
    a = poisson_batches(20, 0.3, 5, torch.Generator().manual_seed(4))
    assert a == poisson_batches(20, 0.3, 5, torch.Generator().manual_seed(4))
    batches = PoissonBatches(
        20, rate=0.3, steps_per_epoch=5, generator=torch.Generator().manual_seed(4), make_loader=lambda lots: iter(lots)
    )
    first, second = list(batches), list(batches)
    assert [lot or None for lot in a] == first and first != second and len(batches) == 5


def test_poisson_batches_hands_out_the_drawn_rows_and_none_for_an_empty_lot():
    rows = torch.arange(6) * 10
    asked: list[list[list[int]]] = []

    def make_loader(lots):
        asked.append(lots)
        return (rows[lot] for lot in lots)

    generator = torch.Generator().manual_seed(1)
    batches = list(PoissonBatches(6, rate=0.15, steps_per_epoch=40, generator=generator, make_loader=make_loader))
    lots = poisson_batches(6, 0.15, 40, torch.Generator().manual_seed(1))
    assert any(not lot for lot in lots) and any(lot for lot in lots)
    assert all(lot or b is None for lot, b in zip(lots, batches))
    assert all(torch.equal(b, rows[lot]) for lot, b in zip(lots, batches) if lot)
    assert asked == [[lot for lot in lots if lot]]  # no collate ever sees an empty list


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5])
def test_a_rate_outside_zero_one_is_refused(rate):
    with pytest.raises(ValueError, match="sampling rate in"):
        poisson_batches(3, rate, 1, torch.Generator())
