"""fl_lightning/phase_times.py: each phase charged its own seconds, nothing recorded unless a log is installed."""

from __future__ import annotations

import time

import pytest

from fl_lightning import phase_times
from fl_lightning.phase_times import item, note, recording_phases, timed


def test_nothing_is_recorded_without_a_log():
    with timed("aggregate"):
        note("generation batches", 3)
        item("pilot", 1.0)
    assert phase_times._phase_log == []


def test_a_phase_is_charged_its_own_seconds_without_those_timed_inside_it(monkeypatch):
    clock = iter([0.0, 1.0, 4.0, 10.0])  # aggregate from 0 to 10 s, generation inside it from 1 to 4 s
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    with recording_phases() as log:
        with timed("aggregate"):
            with timed("generation"):
                note("generation batches", 9, within="generation")
            note("generation batches", 5, within="generation")  # not inside the generation: not counted
            note("store rows", 60)
        item("pilot", 2.5)
    assert log.seconds == {"generation": 3.0, "aggregate": 7.0} and log.calls == {"generation": 1, "aggregate": 1}
    assert log.facts == {"generation batches": 9.0, "store rows": 60.0} and log.items == {"pilot": [2.5]}
    assert phase_times._phase_log == []  # removed at the block's end


def test_a_failing_phase_is_still_charged_and_the_stack_unwinds():
    with recording_phases() as log:
        with pytest.raises(ValueError), timed("evaluation"):
            raise ValueError("boom")
        with timed("aggregate"):
            pass
    assert set(log.seconds) == {"evaluation", "aggregate"} and log._open == []
