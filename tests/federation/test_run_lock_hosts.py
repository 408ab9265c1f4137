"""The run lock across hosts (fl_lightning/federation/storage/run_lock.py, RunLock): a lock left by a run on another
host is taken over once its holder is provably gone (its SLURM job has ended, SLURM requeued our own job, its
heartbeat is too old), refused with one line naming the holder otherwise; the holder's heartbeat thread.

Another host is a lock file naming a host that is not this one; squeue is an injected function (or a fake
``squeue`` script on PATH), never the network.
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from fl_lightning.errors import RunFolderError
from fl_lightning.federation.storage.run_folder import LOCK
from fl_lightning.federation.storage.run_lock import STALE_AFTER_S, RunLock, slurm_job_running


def _other_host_lock(run_dir, *, job="111", restarts=0, heartbeat_age=0.0, old_format=False):
    """A lock as a run on host "node-b" wrote it, its heartbeat (and the file's mtime) ``heartbeat_age`` s old."""
    info = {"pid": 4242, "start": "123", "host": "node-b", "since": "2026-12-01T10:00:00+0000"}
    if not old_format:
        info.update(slurm_job_id=job, slurm_restart_count=restarts, heartbeat=time.time() - heartbeat_age, token="theirs")
    path = run_dir / LOCK
    path.write_text(json.dumps(info))
    then = time.time() - heartbeat_age
    os.utime(path, (then, then))
    return path


def _holder(run_dir):
    return json.loads((run_dir / LOCK).read_text())


def _never_asked(job_id):
    raise AssertionError(f"squeue asked about job {job_id}")


@pytest.fixture
def in_job(monkeypatch):
    """This process runs as SLURM job 222 (its first start)."""
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)


def test_a_lock_whose_slurm_job_has_ended_is_taken_over(tmp_path, in_job, capsys):
    _other_host_lock(tmp_path, job="111")  # a fresh heartbeat: only the job's end tells it is gone
    asked = []
    with RunLock(tmp_path, job_running=lambda job: asked.append(job) or False):
        info = _holder(tmp_path)
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["slurm_job_id"] == "222"
    assert asked == ["111"]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "took over the stale lock" in warning[0], warning
    assert "pid 4242 on host node-b, SLURM job 111" in warning[0]
    assert "its SLURM job 111 is no longer running (squeue)" in warning[0]
    assert not (tmp_path / LOCK).exists()


@pytest.mark.parametrize("running", [True, None], ids=["job-running", "squeue-cannot-tell"])
def test_a_lock_with_a_fresh_heartbeat_is_refused_naming_its_holder(tmp_path, in_job, running):
    path = _other_host_lock(tmp_path, job="111", heartbeat_age=5)
    before = path.read_bytes()
    with pytest.raises(RunFolderError) as caught:
        RunLock(tmp_path, job_running=lambda job: running).acquire()
    message = str(caught.value)
    assert "\n" not in message
    assert f"'{tmp_path}' is in use by another run (pid 4242 on host node-b, SLURM job 111, since " in message
    assert "last heartbeat 5 s ago" in message
    assert f"it counts as stale once its heartbeat is {STALE_AFTER_S:.0f} s old or its SLURM job has ended" in message
    assert f"delete '{path}'" in message
    assert path.read_bytes() == before  # the holder's lock is untouched


def test_a_lock_with_a_stale_heartbeat_is_taken_over(tmp_path, in_job, capsys):
    _other_host_lock(tmp_path, job="111", heartbeat_age=5)  # the job still listed (a job script that goes on)
    with RunLock(tmp_path, heartbeat_s=0.5, stale_after_s=2.0, job_running=lambda job: True):
        assert _holder(tmp_path)["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert "its heartbeat is 5 s old (stale after 2 s)" in err and len(err.strip().splitlines()) == 1, err


def test_the_later_of_heartbeat_and_mtime_counts(tmp_path, in_job):
    """A heartbeat written by a host whose clock is behind: the file's fresh mtime keeps the lock live."""
    path = _other_host_lock(tmp_path, job=None, heartbeat_age=5)
    now = time.time()
    os.utime(path, (now, now))
    with pytest.raises(
        RunFolderError,
        match=r"SLURM job none, .*last heartbeat 0 s ago\); it counts as stale once "
        r"its heartbeat is 2 s old; if no run",
    ):
        RunLock(tmp_path, heartbeat_s=0.5, stale_after_s=2.0, job_running=_never_asked).acquire()


@pytest.mark.parametrize("age, taken", [(1, False), (5, True)], ids=["fresh", "old"])
def test_an_older_versions_lock_counts_by_its_mtime(tmp_path, in_job, age, taken):
    _other_host_lock(tmp_path, heartbeat_age=age, old_format=True)
    lock = RunLock(tmp_path, heartbeat_s=0.5, stale_after_s=2.0, job_running=_never_asked)
    if taken:
        with lock:
            assert _holder(tmp_path)["pid"] == os.getpid()
    else:
        with pytest.raises(RunFolderError, match=r"no heartbeat \(an older version's lock\), written 1 s ago"):
            lock.acquire()


@pytest.mark.parametrize("theirs, taken", [(0, True), (1, False)], ids=["earlier-restart", "same-restart"])
def test_our_own_requeued_job_takes_over_its_earlier_runs_lock(tmp_path, monkeypatch, capsys, theirs, taken):
    """SLURM requeued job 222 (pre-emption, a node lost) onto another host: SLURM_RESTART_COUNT went up. The same
    job and restart on another host (two job steps into one folder) is not provably gone."""
    monkeypatch.setenv("SLURM_JOB_ID", "222")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _other_host_lock(tmp_path, job="222", restarts=theirs)
    lock = RunLock(tmp_path, job_running=_never_asked)  # squeue would say job 222 runs: it is us
    if taken:
        with lock:
            assert _holder(tmp_path)["slurm_restart_count"] == 1
        assert "SLURM requeued job 222 (restart 1; the lock is of restart 0)" in capsys.readouterr().err
    else:
        with pytest.raises(RunFolderError, match="SLURM job 222"):
            lock.acquire()


def test_the_heartbeat_thread_refreshes_the_lock_and_stops_on_release(tmp_path):
    lock = RunLock(tmp_path / "run", heartbeat_s=0.05, stale_after_s=1.0)
    lock.acquire()
    try:
        first = _holder(tmp_path / "run")["heartbeat"]
        deadline = time.monotonic() + 5
        while _holder(tmp_path / "run")["heartbeat"] == first:
            assert time.monotonic() < deadline, "no heartbeat within 5 s"
            time.sleep(0.02)
        beat = lock._beat
        assert beat is not None and beat.is_alive() and beat.daemon
        assert _holder(tmp_path / "run")["token"] == lock._token  # rewritten in place: the same holder
    finally:
        lock.release()
    assert not beat.is_alive()
    time.sleep(0.2)  # a stopped thread writes no more: the lock (and the folder it made) stay gone
    assert not (tmp_path / "run").exists()


def test_a_heartbeat_thread_whose_lock_was_taken_over_stops(tmp_path, capsys):
    lock = RunLock(tmp_path, heartbeat_s=0.05, stale_after_s=1.0)
    lock.acquire()
    taken = {**_holder(tmp_path), "token": "another run's", "pid": 1}
    (tmp_path / LOCK).write_text(json.dumps(taken))
    lock._beat.join(timeout=5)
    assert not lock._beat.is_alive()
    assert _holder(tmp_path) == taken  # never overwritten by the run that lost it
    assert "was taken over by another run" in capsys.readouterr().err
    lock.release()
    assert _holder(tmp_path) == taken  # and not removed on release either


# ----------------------------------------------------------------------------- squeue, as a fake script on PATH


@pytest.mark.parametrize(
    "stdout, stderr, code, expected",
    [
        ("RUNNING\n", "", 0, True),
        ("COMPLETING\n", "", 0, True),
        ("SUSPENDED\n", "", 0, True),
        ("TIMEOUT\n", "", 0, False),
        ("PREEMPTED\n", "", 0, False),
        ("PENDING\n", "", 0, False),  # requeued, waiting: its processes are gone
        ("", "", 0, False),  # not listed: ended
        ("", "slurm_load_jobs error: Invalid job id specified", 1, False),  # forgotten after MinJobAge
        ("", "slurm_load_jobs error: Unable to contact slurm controller", 1, None),
    ],
)
def test_slurm_job_running_reads_squeue(tmp_path, monkeypatch, stdout, stderr, code, expected):
    script = tmp_path / "squeue"
    script.write_text(
        f"#!/bin/sh\n[ \"$*\" = '-h -j 111 -o %T' ] || exit 9\nprintf '{stdout}'\nprintf '{stderr}' >&2\nexit {code}\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm_job_running("111") is expected


def test_slurm_job_running_cannot_tell_without_squeue(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm_job_running("111") is None
