"""The CLI's opt-in collector tuning: paused through the start-up and back on when the rounds begin (or when
released), someone else's "off" left alone, the start-up's objects frozen only during a run; and a run without
it (the library) leaves the collector as it found it."""

import gc

from fl_lightning.experiments.collector import pause_collection
from fl_lightning.federation.simulation import Simulation
from tests.federation.test_simulation import _cfg


def test_pause_is_undone_once_and_leaves_a_collector_that_was_off_alone():
    assert gc.isenabled()
    paused = pause_collection()
    assert not gc.isenabled()
    paused.on_run_start()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    paused.end_run()
    assert gc.get_freeze_count() == 0
    gc.disable()  # someone turns it off again later: a second release must not turn it on
    paused.release()
    assert not gc.isenabled()
    gc.enable()
    gc.disable()
    pause_collection().release()  # off before the pause: off after it
    assert not gc.isenabled()
    gc.enable()


class _Seen:
    def __init__(self):
        self.rounds = []
        self.frozen_at_run_start = None

    def on_run_start(self, **_):
        self.frozen_at_run_start = gc.get_freeze_count() > 0

    def on_round_start(self, **_):
        self.rounds.append((gc.isenabled(), gc.get_freeze_count() > 0))


def test_with_the_collector_callback_a_run_freezes_the_start_up_and_collects_in_its_rounds(tmp_path):
    seen = _Seen()
    paused = pause_collection()
    try:
        Simulation(cfg=_cfg(tmp_path), loggers=[], callbacks=[paused, seen]).run()
    finally:
        paused.release()
    assert seen.rounds == [(True, True), (True, True)]  # on again and the start-up frozen, in every round
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_run_without_it_leaves_the_collector_alone(tmp_path):
    seen = _Seen()
    Simulation(cfg=_cfg(tmp_path), loggers=[], callbacks=[seen]).run()
    assert seen.rounds == [(True, False), (True, False)] and not seen.frozen_at_run_start
    assert gc.isenabled() and gc.get_freeze_count() == 0
