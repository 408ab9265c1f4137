"""The error classes: what they carry, that they survive the server's broadcast (pickle), and that the
client's traceback is their cause."""

from __future__ import annotations

import pickle
import traceback

import pytest

from fl_lightning.errors import (
    ClientFailure,
    ClientUsageError,
    ConfigError,
    RemoteTraceback,
    RunFailure,
    TooFewClients,
    UsageError,
    check,
)

_TRACE = 'Traceback (most recent call last):\n  File "m.py", line 3, in client_update\nRuntimeError: boom\n'


@pytest.mark.parametrize(
    "err, base",
    [
        (ClientFailure("client 1 failed in round 0: RuntimeError: boom", 1, 0, _TRACE), RunFailure),
        (ClientUsageError("client 2 in round 3: corrupt image x.png", 2, 3, _TRACE), UsageError),
        (TooFewClients("round 0: 0 of 3 clients succeeded", 0, 0, {1: _TRACE, 2: "other"}), RunFailure),
        (ConfigError("partition.alpha", 0.0, "a float > 0"), UsageError),
    ],
)
def test_each_error_survives_the_broadcast_with_what_it_carries(err, base):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and isinstance(back, base) and str(back) == str(err)
    assert vars(back) == vars(err)
    if not isinstance(err, ConfigError):
        assert isinstance(back.__cause__, RemoteTraceback) and back.__cause__.text == _TRACE


def test_the_clients_traceback_is_printed_as_the_cause():
    try:
        raise ClientFailure("client 1 failed in round 0: RuntimeError: boom", 1, 0, _TRACE)
    except ClientFailure as err:
        text = "".join(traceback.format_exception(err))
    assert text.index("in client_update") < text.index("The above exception was the direct cause")
    assert text.rstrip().endswith("ClientFailure: client 1 failed in round 0: RuntimeError: boom")


def test_a_rejected_upload_has_no_cause_to_show():
    assert ClientFailure("client 2: non-finite upload", 2, 0).__cause__ is None
    assert TooFewClients("round 0", 0, 0).__cause__ is None


def test_check_names_the_key():
    check(True, "mu", 0.1, "a float >= 0")
    with pytest.raises(ConfigError, match=r"config error: mu=-1 is not allowed; expected a float >= 0"):
        check(False, "mu", -1, "a float >= 0")
