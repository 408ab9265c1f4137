"""The collector around a run: paused through the start-up and back on when the rounds begin (or when
released), someone else's "off" left alone, and the start-up's objects frozen only during the rounds."""

import gc

import pytest

from fl_lightning.federation.collector import frozen_during_rounds, pause_collection
from fl_lightning.federation.simulation import Simulation
from tests.federation.test_simulation import _cfg


def test_pause_is_undone_once_and_leaves_a_collector_that_was_off_alone():
    assert gc.isenabled()
    paused = pause_collection()
    assert not gc.isenabled()
    paused.on_run_start()
    assert gc.isenabled()
    gc.disable()  # someone turns it off again later: a second release must not turn it on
    paused.release()
    assert not gc.isenabled()
    gc.enable()
    gc.disable()
    pause_collection().release()  # off before the pause: off after it
    assert not gc.isenabled()
    gc.enable()


def test_freeze_lasts_for_the_block_only_even_when_it_raises():
    with frozen_during_rounds():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyError), frozen_during_rounds():
        raise KeyError
    assert gc.get_freeze_count() == 0


class _Seen:
    def __init__(self):
        self.rounds = []
        self.frozen_at_run_start = None

    def on_run_start(self, **_):
        self.frozen_at_run_start = gc.get_freeze_count() > 0

    def on_round_start(self, **_):
        self.rounds.append((gc.isenabled(), gc.get_freeze_count() > 0))


def test_a_run_freezes_the_start_up_before_the_pause_ends_collects_in_its_rounds_and_unfreezes_after(tmp_path):
    seen = _Seen()
    paused = pause_collection()
    try:
        Simulation(cfg=_cfg(tmp_path), loggers=[], callbacks=[paused, seen]).run()
    finally:
        paused.release()
    assert seen.rounds == [(True, True), (True, True)]  # on again and the start-up frozen, in every round
    # frozen already when the pause ends (on_run_start): the collector's first pass must not scan the start-up
    assert seen.frozen_at_run_start
    assert gc.isenabled() and gc.get_freeze_count() == 0
