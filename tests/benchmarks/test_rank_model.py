"""benchmarks/rank_model.py: one rank's phase times → N ranks, checked against hand-computed cases (exact numbers)."""

from __future__ import annotations

import json

import pytest

from benchmarks.rank_model import Phase, estimate, format_estimate, phases_from_json
from tests.conftest import REPO

RUN = [
    Phase("aggregate", 10.0, "rank0"),
    Phase("evaluation", 8.0, "blocks", items=5),
    Phase("generation", 100.0, "strided", items=10),
    Phase("pretraining", 60.0, "data_parallel", steps=1000, gradient_bytes=1.5e9),
    Phase("pilots", 40.0, "pilots", rounds=({0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0},)),
    Phase("clients", 12.0, "clients", rounds=({0: 4.0, 1: 2.0, 2: 2.0, 3: 4.0},), client_sizes=(40, 20, 20, 40)),
]


def test_one_rank_returns_the_input_times():
    est = estimate(RUN, 1)
    assert [p.seconds for p in est.phases] == [p.seconds for p in RUN]
    assert est.total_s == est.one_rank_s == 230.0 and est.speedup == 1.0 and est.wait_share == (0.0,)


def test_each_rule_on_two_and_three_ranks_by_hand():
    two = {p.name: p for p in estimate(RUN, 2, bandwidth=150e9).phases}
    assert two["aggregate"].seconds == 10.0 and two["aggregate"].busy == (10.0, 0.0)
    assert two["evaluation"].busy == pytest.approx((8.0 * 2 / 5, 8.0 * 3 / 5))  # blocks of 5: [0, 2), [2, 5)
    assert two["generation"].seconds == pytest.approx(50.0)  # 5 of 10 batches each
    # 60/2 + 1000 steps x 2(2-1)/2 x 1.5 GB / 150 GB/s = 30 + 10
    assert two["pretraining"].seconds == pytest.approx(40.0) and two["pretraining"].communication_s == pytest.approx(10.0)
    assert two["pilots"].busy == pytest.approx((20.0, 20.0))  # pilots 0, 2 and 1, 3
    # assign_clients by size (40, 20, 20, 40): 0 → r0, 3 → r1, 1 → r0... loads 60/60: r0 {0, 1}, r1 {2, 3}
    assert two["clients"].busy == pytest.approx((6.0, 6.0)) and two["clients"].seconds == pytest.approx(6.0)

    three = {p.name: p for p in estimate(RUN, 3, bandwidth=150e9).phases}
    assert three["generation"].seconds == pytest.approx(40.0)  # ⌈10/3⌉ = 4 of 10 batches: 4/10 · 100
    assert three["evaluation"].seconds == pytest.approx(8.0 * 2 / 5)  # blocks 1, 2, 2 of 5
    assert three["pilots"].busy == pytest.approx((20.0, 10.0, 10.0))  # pilots {0, 3}, {1}, {2}
    assert three["pretraining"].seconds == pytest.approx(20.0 + 1000 * 4 / 3 * 1.5e9 / 150e9)
    # sizes (40, 20, 20, 40): 0 → r0, 3 → r1, 1 → r2, 2 → r2: busy 4, 4, 4 (the client seconds 4, 4, 2 + 2)
    assert three["clients"].busy == pytest.approx((4.0, 4.0, 4.0))


def test_the_total_waits_and_the_speedup_add_up():
    est = estimate(RUN, 2, bandwidth=150e9)
    # 10 + 4.8 + 50 + 40 + 20 + 6
    assert est.total_s == pytest.approx(130.8) and est.speedup == pytest.approx(230.0 / 130.8)
    # rank 0 idles in the evaluation (its 2 of 5 batches: 4.8 - 3.2), rank 1 in the aggregate (10)
    assert est.wait_share == pytest.approx((1.6 / 130.8, 10.0 / 130.8))


def test_measured_item_times_are_scaled_to_the_phase_and_rounds_meet():
    """Two rounds: each lasts its busiest rank; the items' sum (10 s) is scaled to the phase's T (20 s)."""
    clients = Phase("clients", 20.0, "clients", rounds=({0: 4.0, 1: 1.0}, {0: 1.0, 1: 4.0}), client_sizes=(1, 1))
    est = estimate([clients], 2).phases[0]
    assert est.busy == pytest.approx((10.0, 10.0)) and est.seconds == pytest.approx(16.0)  # 2·(4 + 4)


def test_the_rank0_phases_bound_the_speedup():
    """Amdahl: whatever N, the total is at least the rank-0 phases; the speed-up tends to their bound."""
    run = [Phase("solve", 10.0, "rank0"), Phase("generation", 90.0, "strided", items=1_000_000)]
    for n in (2, 8, 64, 1024):
        est = estimate(run, n)
        assert est.serial_bound == pytest.approx(10.0) and est.speedup <= est.serial_bound
    assert estimate(run, 1024).speedup == pytest.approx(100.0 / (10.0 + 90.0 / 1024), rel=1e-3)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="rule must be one of"):
        Phase("x", 1.0, "everywhere")
    with pytest.raises(ValueError, match="ranks >= 1"):
        estimate(RUN, 0)


def test_the_shipped_h100_file_reads_and_every_number_has_a_source():
    data = json.loads((REPO / "benchmarks/data/fedisyn_food101_h100.json").read_text(encoding="utf-8"))
    for entry in [*data["phases"], *data["assumptions"].values()]:
        assert entry.get("source") and entry.get("kind") in ("stated", "derived", "assumed"), entry
    phases = phases_from_json(data)
    assert estimate(phases, 1).total_s == pytest.approx(sum(p["seconds"] for p in data["phases"]))
    lines = format_estimate(estimate(phases, 8))
    assert lines[0].startswith("N = 8") and any("speed-up" in line for line in lines)


def test_pilots_over_all_ranks_speed_up_as_the_other_phases_together_by_hand():
    run = [
        Phase("pilots", 100.0, "pilots_all"),
        Phase("generation", 40.0, "strided", items=4),
        Phase("evaluation", 10.0, "rank0"),
    ]
    two = estimate(run, 2)
    pilots = two.phases[0]
    # the other phases: 50 s on one rank, 20 + 10 = 30 s on two (ratio 0.6); rank 0 busy 30 of 50, rank 1 20 of 50
    assert pilots.seconds == pytest.approx(60.0) and pilots.busy == pytest.approx((60.0, 40.0))
    assert two.total_s == pytest.approx(90.0) and two.speedup == pytest.approx(150.0 / 90.0)
    assert estimate(run, 1).phases[0].seconds == 100.0  # one rank: the input
    # one pilot per rank (the default) on the same input: the pilots' round lasts its busiest rank
    one_each = estimate([Phase("pilots", 100.0, "pilots", rounds=({0: 70.0, 1: 30.0},)), *run[1:]], 2)
    assert one_each.phases[0].seconds == pytest.approx(70.0)
