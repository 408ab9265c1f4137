"""The tiny runs the federation tests build again and again, one definition each: the tiny FedAvg digits config
in a folder (in process, or as ``python -m fl_lightning.train`` in a fresh one), and the same run on one and on
two processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_lightning.config.loading import load_config
from fl_lightning.errors import UsageError
from fl_lightning.federation.simulation import Simulation
from fl_lightning.federation.storage.checkpoint import safe_load
from tests.conftest import CONF, REPO, run_cli

TINY = CONF / "fedavg_digits_tiny.yaml"
FEDOPAL_TINY = CONF / "fedopal_digits_tiny.yaml"  # a tiny random prompted ViT


def tiny_overrides(out: Path, *extra: str, rounds: int = 2, clients: int = 4, progress: bool = False) -> list[str]:
    """The overrides of a tiny run into ``out``: ``rounds`` rounds over ``clients`` clients, the progress lines off
    unless ``progress``, then ``extra`` (which may set any of these again: the last value wins)."""
    return [
        "--output_dir",
        str(out),
        "--federation.rounds",
        str(rounds),
        "--partition.num_clients",
        str(clients),
        "--logging.progress",
        str(progress).lower(),
        *extra,
    ]


def fedopal_overrides(out: Path, *extra: str, clients: int = 4) -> list[str]:
    """The overrides of a tiny FedOPAL-family run (:data:`FEDOPAL_TINY`) into ``out``: one local epoch over
    ``clients`` clients, no progress bar, then ``extra``."""
    return [
        "--output_dir",
        str(out),
        "--logging.progress",
        "false",
        "--train.epochs",
        "1",
        "--partition.num_clients",
        str(clients),
        *extra,
    ]


def tiny_config(out: Path, *extra: str, rounds: int = 2, clients: int = 4, config: Path = TINY):
    """``config`` (the tiny FedAvg digits head unless told) loaded with :func:`tiny_overrides`."""
    return load_config(config, tiny_overrides(out, *extra, rounds=rounds, clients=clients))


def quiet_config(out: Path, config: str, *extra: str):
    """conf/``config`` into ``out`` without progress lines, then ``extra``."""
    return load_config(CONF / config, ["--output_dir", str(out), "--logging.progress", "false", *extra])


def one_client_one_round(out: Path, config: str, samples: int) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """conf/``config`` run in this process into ``out`` with one client for one round on ``samples`` samples (the
    federated side of a test against centralized training): its config, summary and final server state."""
    cfg = quiet_config(
        out, config, "--partition.num_clients", "1", "--federation.rounds", "1", "--data.num_samples", str(samples)
    )
    summary = Simulation(cfg=cfg, loggers=[]).run()
    return cfg, summary, server_pt(cfg.run_dir)["state"]


def cpu_precision_config(out: Path, config: str, precision: str, *extra: str):
    """conf/``config`` into ``out`` on the CPU at ``federation.precision`` ``precision``, no progress lines, then
    ``extra``."""
    return quiet_config(out, config, "--federation.accelerator", "cpu", "--federation.precision", precision, *extra)


def cli_run(
    out: Path,
    *extra: str,
    config: Path = TINY,
    run_name: str | None = "run",
    rounds: int | None = None,
    clients: int | None = None,
    samples: int | None = None,
    tail: int = 2000,
) -> Path:
    """``python -m fl_lightning.train --config CONFIG`` into ``out`` in a fresh process on one CPU thread, as a user
    runs it: named ``run_name`` (the config's own name if None), no progress bar, the rounds, clients and samples
    given, then ``extra``. Asserts it exits 0 (the last ``tail`` characters of its stderr if not); returns the run's
    folder (``out / run_name``)."""
    args = ["--config", str(config), "--output_dir", str(out)]
    if run_name is not None:
        args += ["--run_name", run_name]
    args += ["--logging.progress", "false"]
    for key, value in (("federation.rounds", rounds), ("partition.num_clients", clients), ("data.num_samples", samples)):
        if value is not None:
            args += [f"--{key}", str(value)]
    done = run_cli(*args, *extra, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-tail:]
    return out / run_name if run_name is not None else out


def server_pt(run: Path) -> dict[str, Any]:
    """All of ``run``'s ``checkpoints/server.pt`` (the state, the policies' parts, the round)."""
    return safe_load(run / "checkpoints" / "server.pt")


def one_and_two_processes(tmp_path: Path, *extra: str, **run: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`cli_run` with ``extra`` and ``run``'s keywords into ``tmp_path/one`` and, with
    ``--federation.devices 2``, into ``tmp_path/two``: both runs' ``server.pt``."""
    one = server_pt(cli_run(tmp_path / "one", *extra, **run))
    two = server_pt(cli_run(tmp_path / "two", *extra, "--federation.devices", "2", **run))
    return one, two


def assert_parts_equal(one: dict[str, Any], two: dict[str, Any], parts: tuple[str, ...]) -> None:
    """Each of ``parts`` of two ``server.pt`` (e.g. ``state``, ``server_optimizer``) has the same keys and equal
    tensors in both."""
    for part in parts:
        assert one[part].keys() == two[part].keys()
        for key in one[part]:
            assert torch.equal(one[part][key], two[part][key]), (part, key)


def start_train(*overrides: str, config: Path = TINY) -> subprocess.Popen:
    """``python -m fl_lightning.train --config CONFIG OVERRIDES`` started in the background (stdout dropped, stderr
    piped), to be killed mid-run (tests/run_records.py's ``kill_after_round_0``)."""
    argv = [sys.executable, "-m", "fl_lightning.train", "--config", str(config), *overrides]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )


def comparison_runs(tmp_path: Path, capsys, config: str, *extra: str, rounds: int, samples: int) -> dict[str, Any]:
    """The CLI's ``main`` (in this process) on the bundled comparison ``config`` (a conf/ file with variants) into
    ``tmp_path``, ``rounds`` rounds on ``samples`` samples, then ``extra``; asserts it exits 0 (its stderr if not).
    Returns each variant's ``server.pt`` by its run folder's name."""
    from fl_lightning import train  # the CLI's module, imported where a test runs it

    argv = ["--config", str(CONF / config), "--output_dir", str(tmp_path), "--federation.rounds", str(rounds)]
    rc = train.main([*argv, "--data.num_samples", str(samples), *extra])
    assert rc == 0, capsys.readouterr().err
    return {p.parent.parent.name: safe_load(p) for p in tmp_path.glob("*/checkpoints/server.pt")}


def assert_refused_in_one_line(config: Callable[[], Any], *words: str, run: bool = False) -> None:
    """Loading the config ``config()`` and setting up its simulation (and running it, if ``run``) stops with a
    one-line :class:`UsageError` that holds each of ``words`` (a bad value may stop the loading already)."""
    with pytest.raises(UsageError) as err:
        simulation = Simulation(cfg=config(), loggers=[])
        if run:
            simulation.run()
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value), str(err.value)
