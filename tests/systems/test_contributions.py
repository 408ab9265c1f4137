"""Tests for fl_lightning.systems.contributions: the (device, block) contribution estimates CLC prices."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.systems.contributions import estimate_contributions, estimate_layer_contributions


def test_estimate_uses_latest_measurement_then_last_round_mean():
    history = {0: 9.0, 3: 1.0, 4: 2.0}  # block 0 measured in an older round
    last_round = {3: 1.5, 4: 2.5}  # trained last round: blocks 3, 4 (mean 2.0)
    out = estimate_layer_contributions(history, 5, prior=7.0, last_round=last_round)
    np.testing.assert_array_equal(out, [9.0, 2.0, 2.0, 1.5, 2.5])
    assert out.dtype == np.float64


def test_estimate_without_last_round_uses_history_mean_and_prior():
    np.testing.assert_array_equal(estimate_layer_contributions({2: 4.0, 1: 2.0}, 4, prior=0.0), [3.0, 2.0, 4.0, 3.0])
    np.testing.assert_array_equal(estimate_layer_contributions({}, 3, prior=0.5), [0.5, 0.5, 0.5])


def test_estimate_rejects_bad_layers():
    with pytest.raises(ValueError, match="outside"):
        estimate_layer_contributions({5: 1.0}, 5, prior=0.0)
    with pytest.raises(ValueError, match="num_layers"):
        estimate_layer_contributions({}, 0, prior=0.0)


def test_table_estimate_matches_the_per_device_rule_by_hand():
    values = np.array([[0.0, 4.0, 2.0], [0.0, 0.0, 0.0], [5.0, 1.0, 3.0]])
    rounds = np.array([[-1, 1, 2], [-1, -1, -1], [1, 2, 2]])
    out = estimate_contributions(values, rounds)
    # device 0: block 2 is its latest (round 2) → unmeasured block 0 gets 2.0; block 1 keeps 4.0
    # device 1: never measured → prior = mean of all 6 measurements = (4 + 2 + 5 + 1 + 3) / 5
    # device 2: latest round 2 = blocks 1, 2; block 0 measured in round 1 keeps 5.0
    np.testing.assert_allclose(out, [[2.0, 4.0, 2.0], [3.0, 3.0, 3.0], [5.0, 1.0, 3.0]])
    np.testing.assert_array_equal(estimate_contributions(np.zeros((2, 2)), np.full((2, 2), -1)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        estimate_contributions(np.zeros((2, 2)), np.zeros((2, 3)))
