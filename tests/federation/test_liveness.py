"""A rank that is dead or frozen ends every rank in minutes (federation/ranks/liveness.py), as NCCL would need it: NCCL
notices neither a killed peer nor a frozen one, so these tests stop a rank (SIGSTOP) as well as kill it.

Unit tests: two watches over one in-process store (a short patience), their verdicts collected instead of exiting.
Then the CLI on 2 CPU processes (gloo), a rank frozen or killed where it stands: two "nodes" under torchrun (each
node's agent watches only its own rank, as on a cluster) and Fabric's launcher with its rank 0 — the process that
holds the job's store — frozen.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from fl_lightning.federation.ranks import liveness
from fl_lightning.federation.ranks.liveness import DONE, FAILED, STOPPED, Liveness, PeerLost, PeerState
from tests.conftest import CONF, REPO
from tests.gloo_ranks import free_port, torchrun_node

HOST = socket.gethostname()
PATIENCE = 2.4  # a beat every 0.4 s: a busy CI machine delays a thread by far less
SLACK = 2.0  # what a loaded machine may add to a reaction time


class _Verdicts:
    """What a watch's ``on_lost`` received: (line or None, status), and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, int, float]] = []
        self.event = threading.Event()

    def __call__(self, line: str | None, status: int) -> None:
        self.calls.append((line, status, time.monotonic()))
        self.event.set()


def _watches(store=None, world: int = 2) -> tuple[list[Liveness], list[_Verdicts]]:
    store = store or dist.HashStore()
    verdicts = [_Verdicts() for _ in range(world)]
    watches = [Liveness(store, rank=r, world=world, patience_s=PATIENCE, on_lost=verdicts[r]) for r in range(world)]
    for w in watches:
        w.start()
    return watches, verdicts


def _freeze(watch: Liveness) -> None:
    """The rank stops beating and writes nothing more (SIGSTOP, SIGKILL, a host lost)."""
    watch._stop.set()
    watch._thread.join()


def test_ranks_that_beat_are_never_reported():
    watches, verdicts = _watches(world=3)
    time.sleep(4 * PATIENCE)
    for w in watches:
        w.stop()
    assert [v.calls for v in verdicts] == [[], [], []]


def test_a_silent_rank_is_reported_by_the_lowest_live_rank_within_its_patience():
    (w0, w1, w2), (v0, v1, v2) = _watches(world=3)
    time.sleep(2 * PATIENCE)  # a running job
    frozen = time.monotonic()
    _freeze(w1)
    assert v0.event.wait(PATIENCE + 3 * w0.interval_s + 2 * SLACK) and v2.event.wait(5.0)
    ((line, status, at),) = v0.calls
    assert status == 1 and PATIENCE - 2 * w0.interval_s <= at - frozen <= PATIENCE + 3 * w0.interval_s + SLACK
    assert re.fullmatch(
        rf"rank 1 on {re.escape(HOST)} stopped answering: no heartbeat for \d+ s "
        r"\(federation.liveness_timeout_s=2.4; killed, frozen or its host lost\); every rank stops; "
        r"the same command resumes from the last completed round",
        line,
    ), line
    assert v2.calls[0][:2] == (None, 1)  # every other rank exits quietly with the same status
    assert v1.calls == []
    w0.stop(), w2.stop()


def test_a_rank_that_ends_in_order_is_never_taken_for_dead():
    (w0, w1), (v0, v1) = _watches()
    w1.stop(DONE)  # a finished run (or STOPPED: an error every rank was told of)
    time.sleep(3 * PATIENCE)
    assert v0.calls == [] and v1.calls == []
    w0.stop(STOPPED)


@pytest.mark.parametrize("failing, printer", [(1, 0), (0, None)])
def test_a_rank_that_failed_outside_an_exchange_ends_the_others_at_once_with_its_status(failing, printer):
    """Rank 1's failure (say, its node cannot read the data): rank 0 names it at once with its status. Rank 0's own
    failure: rank 0 printed it itself, the others exit quietly with its status."""
    watches, verdicts = _watches()
    start = time.monotonic()
    watches[failing].stop(FAILED, status=2, line="data.path: no such folder\n/data/x")
    other = 1 - failing
    assert verdicts[other].event.wait(5.0)
    ((line, status, at),) = verdicts[other].calls
    assert status == 2 and at - start < 3 * watches[other].interval_s + SLACK
    if printer is None:
        assert line is None
    else:
        assert line == (
            f"rank 1 on {HOST} failed: data.path: no such folder /data/x; every rank stops; the same "
            f"command resumes from the last completed round"
        )
    watches[other].stop()


@pytest.mark.parametrize("failing", [1, 0])
def test_a_rank_waiting_with_its_error_for_peers_that_never_come_ends_the_job_after_two_beats(failing):
    """Rank ``failing`` enters an exchange of outcomes holding its error; the other sits in a compute collective it
    will never join (alive, beating): the other names it after the grace with its status; it ends quietly after."""
    watches, verdicts = _watches()
    other = 1 - failing
    start = time.monotonic()
    watches[failing].failing(2, "round 0's server phase", "DiskFullError: no space left\non /full")
    assert verdicts[other].event.wait(watches[other].grace_s + 3 * watches[other].interval_s + SLACK)
    ((line, status, at),) = verdicts[other].calls
    assert status == 2 and at - start >= watches[other].grace_s
    expected = (
        f"rank {failing} on {HOST} failed in round 0's server phase: DiskFullError: no space left on /full; "
        f"every rank stops; the same command resumes from the last completed round"
    )
    assert verdicts[failing].event.wait(watches[failing].grace_s + 5 * watches[failing].interval_s + SLACK)
    ((own_line, own_status, own_at),) = verdicts[failing].calls
    assert own_status == 2 and own_at > at  # after the other: a launcher cannot cut the printer short
    if failing == 1:  # rank 0 names it; rank 1 ends quietly
        assert line == expected and own_line is None
    else:  # rank 0 prints its own error (its gloo exchange notices the others go; else its watch does): once
        assert line is None and own_line == expected


def test_a_failing_rank_whose_peers_come_ends_nothing():
    """The usual exchange: the peers arrive within a beat, every rank stops in order (stopped entries)."""
    (w0, w1), (v0, v1) = _watches()
    w1.failing(1, "round 0's clients", "ValueError: a bug")
    time.sleep(w0.interval_s)
    w1.stop(STOPPED), w0.stop(STOPPED)
    time.sleep(w0.grace_s + 3 * w0.interval_s)
    assert v0.calls == [] and v1.calls == []


def test_a_rank_that_never_started_its_watch_is_reported():
    store = dist.HashStore()
    verdicts = _Verdicts()
    w0 = Liveness(store, rank=0, world=2, patience_s=PATIENCE, on_lost=verdicts).start()
    assert verdicts.event.wait(PATIENCE + 3 * w0.interval_s + 2 * SLACK)
    assert verdicts.calls[0][0].startswith("rank 1 stopped answering: never started its watch")
    w0.stop()


class _DyingStore:
    """A store whose host goes away when ``dead`` is set: its calls then fail, as a closed connection's do, or
    (``frozen``) never return, as a TCP store's calls on a frozen server do (its timeout only warns)."""

    def __init__(self, frozen: bool) -> None:
        self.store, self.dead, self.frozen = dist.HashStore(), threading.Event(), frozen

    def __getattr__(self, name):
        def call(*args):
            if self.dead.is_set():
                if self.frozen:
                    threading.Event().wait()
                raise dist.DistNetworkError("Connection reset by peer")
            return getattr(self.store, name)(*args)

        return call


@pytest.mark.parametrize("frozen", [False, True], ids=["gone", "frozen"])
def test_a_store_that_stops_answering_ends_every_rank_and_rank_1_names_rank_0(frozen):
    store = _DyingStore(frozen)
    (w0, w1), (v0, v1) = _watches(store)
    time.sleep(PATIENCE)
    gone = time.monotonic()
    store.dead.set()  # rank 0's process (which holds it under Fabric's launcher) has gone, or is frozen
    assert v1.event.wait(PATIENCE + 3 * w1.interval_s + 2 * SLACK)
    ((line, status, at),) = v1.calls
    assert status == 1 and at - gone <= (PATIENCE + 2 * w1.interval_s if frozen else 2 * w1.interval_s + 1.0) + SLACK
    assert line.startswith(
        f"the job's store stopped answering (rank 0 on {HOST}, which holds it under Fabric's "
        "launcher and SLURM, or torchrun's agent, has gone or is frozen)"
    ), line
    w0.stop(), w1.stop()


@pytest.mark.parametrize("state", [DONE, STOPPED])
def test_a_store_gone_with_a_rank_0_that_ended_in_order_ends_nothing(state):
    """Rank 0 finished (or stopped with an error every rank was told of) and exited, its store with it, while rank 1
    still writes its last files: rank 1's own ending decides its exit."""
    store = _DyingStore(frozen=False)
    (w0, w1), (v0, v1) = _watches(store)
    w0.stop(state)
    time.sleep(3 * w1.interval_s)  # rank 1 reads rank 0's entry
    store.dead.set()
    time.sleep(PATIENCE + 3 * w1.interval_s)
    assert v1.calls == []
    w1.stop()


def test_a_frozen_rank_on_this_host_is_killed():
    """Its entry names its host and pid: a frozen rank on this host stops holding its GPU."""
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        store = dist.HashStore()
        store.set("rank1", PeerState(1, "running", 0, HOST, frozen.pid, "").encode())
        verdicts = _Verdicts()
        w0 = Liveness(store, rank=0, world=2, patience_s=PATIENCE, on_lost=verdicts).start()
        assert verdicts.event.wait(PATIENCE + 3 * w0.interval_s + 2 * SLACK)
        assert frozen.wait(timeout=10) == -signal.SIGKILL
        w0.stop()
    finally:
        frozen.kill()


def test_a_store_frozen_with_rank_0_before_rank_1_read_it_still_names_and_kills_rank_0():
    """Rank 0 (holding the store) froze before rank 1's first beat: rank 1 never read its entry, and knows its host
    and pid from the start's broadcast — the line names the host, and the frozen rank 0 on this host is killed."""
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        store = _DyingStore(frozen=True)
        verdicts = _Verdicts()
        w1 = Liveness(store, rank=1, world=2, patience_s=PATIENCE, on_lost=verdicts, leader=(HOST, frozen.pid))
        w1.start()  # its first entry written
        store.dead.set()  # frozen before rank 1's first beat: no later call returns, rank 0's entry never read
        assert verdicts.event.wait(PATIENCE + 3 * w1.interval_s + 2 * SLACK)
        ((line, status, _),) = verdicts.calls
        assert status == 1 and line.startswith(f"the job's store stopped answering (rank 0 on {HOST}, which holds")
        assert frozen.wait(timeout=10) == -signal.SIGKILL
    finally:
        frozen.kill()


def test_a_broken_collective_without_a_watch_is_one_line():
    err = liveness.lost_peer(
        0,
        "round 3's clients",
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234\nmore"),
    )
    assert isinstance(err, PeerLost) and "\n" not in str(err)
    assert str(err) == (
        "rank 0 lost its connection to another rank during round 3's clients ([../third_party/gloo/"
        "gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234); every rank "
        "stops; the same command resumes from the last completed round"
    )
    assert liveness.connection_lost(dist.DistNetworkError("x")) and not liveness.connection_lost(ValueError("y"))


@pytest.mark.parametrize("value", ["0", "4.9", "nan", "inf", "2e9"])
def test_a_bad_liveness_timeout_is_a_config_error(value):
    from fl_lightning.config.loading import load_config
    from fl_lightning.errors import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"federation.liveness_timeout_s=.* is not allowed; expected a float in "
        r"\[5, 1e9\]",
    ):
        load_config(CONF / "fedavg_digits_tiny.yaml", ["--federation.liveness_timeout_s", value])


def test_one_rank_keeps_no_watch():
    with liveness.watching(
        None, rank=0, world=1, patience_s=60, token="t", exit_status=lambda e: 1, one_line=str, decided=lambda e: False
    ) as watch:
        assert watch is None


# ------------------------------------------------------------------------------------------- the CLI
JOB = Path(__file__).with_name("rank_safety_job.py")
_LIVENESS_S = 8.0


def _env(hook: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "FL_TEST_SIGNAL_HOOK": hook}


def _cli(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(CONF / "fedavg_digits_tiny.yaml"),
        "--output_dir",
        str(tmp_path / "runs"),
        "--federation.rounds",
        "1",
        "--federation.accelerator",
        "cpu",
        "--logging.progress",
        "false",
        "--federation.collective_timeout_s",
        "600",
        "--federation.liveness_timeout_s",
        str(_LIVENESS_S),
        *extra,
    ]


def _kill_leftovers(out: Path) -> None:
    for pid_file in out.glob("rank*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGSTOP", "SIGKILL"])
def test_a_rank_frozen_or_killed_on_another_node_ends_the_job_with_one_line(signum, tmp_path):
    """Two "nodes" under torchrun, one rank each: node 1's rank freezes (or is killed) as round 0 starts, while rank
    0 waits for its records. Rank 0 prints one line naming rank 1 and its host within the liveness timeout (not
    the collective's 600 s), no traceback; node 1's frozen rank is killed by rank 0's watch (the same host here),
    so both nodes' launchers end."""
    out, port = tmp_path / "ranks", str(free_port())
    procs = [
        subprocess.Popen(
            [
                *torchrun_node(node, port),
                str(JOB),
                str(out),
                *_cli(tmp_path, "--federation.num_nodes", "2", "--federation.devices", "1"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=_env(f"on_round_start:1:{signum}"),
        )
        for node in (0, 1)
    ]
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
        _kill_leftovers(out)
    rank0 = (out / "rank0.err").read_text()
    raised = float((out / "raised").read_text())
    assert procs[0].returncode != 0 and procs[1].returncode != 0, results
    ours = [line for line in rank0.splitlines() if line.startswith("fl_lightning:")]
    assert len(ours) == 1, rank0[-3000:]
    assert re.fullmatch(
        rf"fl_lightning: rank 1 on {re.escape(HOST)} stopped answering: no heartbeat for \d+ s "
        rf"\(federation.liveness_timeout_s={_LIVENESS_S:g}; killed, frozen or its host lost\); every "
        r"rank stops; the same command resumes from the last completed round",
        ours[0],
    ), ours
    assert "Traceback" not in rank0
    ended = (out / "rank0.err").stat().st_mtime
    assert ended - raised < _LIVENESS_S + 15, ended - raised  # the watch, not the collective's 600 s


@pytest.mark.slow
def test_rank0_frozen_under_fabrics_launcher_ends_its_children_and_itself(tmp_path):
    """Fabric's launcher: rank 0 is the parent and holds the job's store. Frozen as round 0 starts, its child
    (rank 1) notices the store has stopped answering, prints one line naming rank 0, kills the frozen rank 0 (the
    same host: no GPU stays held) and exits 1 — within the liveness timeout, not the collective's 600 s."""
    out = tmp_path / "ranks"
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(JOB), str(out), *_cli(tmp_path, "--federation.devices", "2")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**_env("on_round_start:0:SIGSTOP"), "MASTER_PORT": str(free_port())},
        timeout=300,
    )
    _kill_leftovers(out)
    rank1 = (out / "rank1.err").read_text()
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, rank1[-3000:])
    ours = [line for line in rank1.splitlines() if line.startswith("fl_lightning:")]
    assert (
        len(ours) == 1
        and ours[0].startswith("fl_lightning: the job's store at 127.0.0.1:")
        and (f"stopped answering (rank 0 on {HOST}, which holds it" in ours[0])
    ), rank1[-3000:]
    assert time.monotonic() - start < 180
    raised = float((out / "raised").read_text())
    assert (out / "rank1.err").stat().st_mtime - raised < 2 * _LIVENESS_S + 15
