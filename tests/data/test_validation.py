"""The validation share (fl_lightning/data/validation.py): carved from the client's own data only."""

import numpy as np
import pytest

from fl_lightning.data.validation import validation_split


@pytest.mark.parametrize(
    "n, fraction, seed", [(0, 0.2, 0), (1, 0.5, 1), (7, 0.2, (3, 4)), (100, 0.2, 5), (143, 0.0, 6), (50, 0.99, 7)]
)
def test_shares_are_disjoint_sorted_and_cover_the_client(n, fraction, seed):
    fit, val = validation_split(n, fraction, seed)
    assert len(val) == int(np.floor(fraction * n)) and len(fit) >= min(n, 1)
    assert np.intersect1d(fit, val).size == 0
    assert np.array_equal(np.sort(np.concatenate([fit, val])), np.arange(n))
    assert np.all(np.diff(fit) > 0) and np.all(np.diff(val) > 0)


def test_same_seed_same_share_other_seed_other_share():
    a = validation_split(200, 0.2, (0, 3))[1]
    assert np.array_equal(a, validation_split(200, 0.2, (0, 3))[1])
    assert not np.array_equal(a, validation_split(200, 0.2, (0, 4))[1])


@pytest.mark.parametrize("n, fraction", [(-1, 0.2), (10, 1.0), (10, -0.1)])
def test_rejects_bad_input(n, fraction):
    with pytest.raises(ValueError):
        validation_split(n, fraction, 0)
