"""Tests for fl_lightning.systems.clock.SimulatedClock."""

from __future__ import annotations

import json

import pytest

from fl_lightning.systems.clock import PHASES, SimulatedClock


def test_total_is_generation_plus_pretraining_plus_rounds() -> None:
    clock = SimulatedClock()
    clock.add("generation", 100.0)
    clock.add("pretraining", 40.5)
    for t in (1.0, 2.5, 3.25):
        clock.add("round", t)
    assert clock.total_s == pytest.approx(100.0 + 40.5 + 6.75)
    assert clock.phase_totals == {"generation": 100.0, "pretraining": 40.5, "round": 6.75}
    assert clock.phase_s("round") == 6.75
    assert clock.round_times == [1.0, 2.5, 3.25]


def test_a_fresh_clock_is_zero() -> None:
    clock = SimulatedClock()
    assert clock.total_s == 0.0 and clock.round_times == []
    assert set(clock.phase_totals) == set(PHASES)


@pytest.mark.parametrize("phase, seconds", [("training", 1.0), ("round", -1.0),
                                            ("round", float("inf")), ("generation", float("nan"))])
def test_bad_phase_or_seconds_raise(phase: str, seconds: float) -> None:
    clock = SimulatedClock()
    with pytest.raises(ValueError):
        clock.add(phase, seconds)
    assert clock.total_s == 0.0


def test_state_dict_round_trips_through_json_and_resumes() -> None:
    clock = SimulatedClock()
    clock.add("generation", 5.0)
    clock.add("round", 2.0)
    state = json.loads(json.dumps(clock.state_dict()))
    resumed = SimulatedClock()
    resumed.load_state_dict(state)
    resumed.add("round", 3.0)
    assert resumed.total_s == pytest.approx(10.0)
    assert resumed.round_times == [2.0, 3.0]
    assert clock.round_times == [2.0]  # the original is untouched


def test_load_state_dict_rejects_unknown_phases() -> None:
    with pytest.raises(ValueError):
        SimulatedClock().load_state_dict({"totals": {"warmup": 1.0}, "round_times": []})


def test_accessors_return_copies() -> None:
    clock = SimulatedClock()
    clock.add("round", 1.0)
    clock.round_times.append(99.0)
    clock.phase_totals["round"] = 99.0
    assert clock.round_times == [1.0] and clock.phase_s("round") == 1.0
