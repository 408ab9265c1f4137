"""The real CLI: exit codes and one-line errors (each case is a fresh process, as a user sees it)."""

import json
import os
import signal
import subprocess
import sys
import time

from tests.conftest import CONF, REPO, run_cli

TINY = str(CONF / "fedavg_digits_tiny.yaml")
OPAL = str(CONF / "fedopal_digits_tiny.yaml")


def test_usage_error_from_a_real_process_is_one_line():
    """The `python -m fl_lightning.train` wiring (sys.exit(main())); the whole table of hostile inputs is in
    tests/test_hostile_inputs.py, in one process."""
    out = run_cli("--config", "does/not/exist.yaml")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "config file 'does/not/exist.yaml' not found" in lines[0], out.stderr


def test_missing_dataset_is_one_line(tmp_path):
    out = run_cli(
        "--config",
        TINY,
        "--data.name",
        "cifar10",
        "--data.root",
        str(tmp_path / "nodata"),
        "--output_dir",
        str(tmp_path / "runs"),
    )
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert "cifar10" in last and "data.root" in last and "data.download" in last and "Traceback" not in out.stderr


def test_print_config_round_trips(tmp_path):
    out = run_cli("--config", TINY, "--partition.alpha", "inf", "--print-config")
    assert out.returncode == 0, out.stderr
    assert "alpha: .inf" in out.stdout
    path = tmp_path / "resolved.yaml"
    path.write_text(out.stdout)
    again = run_cli("--config", str(path), "--print-config")
    assert again.stdout == out.stdout


def test_resume_from_the_cli_extends_a_finished_run(tmp_path):
    """`--resume RUN_DIR` reads the run's own config.yaml; more rounds continue from its checkpoint."""
    base = ["--config", TINY, "--partition.num_clients", "3", "--logging.progress", "false"]
    straight = run_cli(*base, "--federation.rounds", "2", "--output_dir", str(tmp_path / "straight"))
    first = run_cli(*base, "--federation.rounds", "1", "--output_dir", str(tmp_path / "resumed"))
    run_dir = tmp_path / "resumed" / "fedavg_digits_a0.5_s0"
    again = run_cli("--resume", str(run_dir), "--federation.rounds", "2")
    assert straight.returncode == first.returncode == again.returncode == 0, again.stderr[-2000:]
    a = json.loads((tmp_path / "straight" / run_dir.name / "summary.json").read_text())
    b = json.loads((run_dir / "summary.json").read_text())
    for key in ("accuracy", "loss", "rounds", "bytes_up", "bytes_down", "per_class_accuracy"):
        assert a[key] == b[key], key


def test_sigterm_keeps_the_checkpoint_and_prints_the_resume_hint(tmp_path):
    """SIGTERM (a scheduler's stop) is handled as Ctrl-C: exit 143 (128 + SIGTERM), the --resume line."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fl_lightning.train",
            "--config",
            TINY,
            "--partition.num_clients",
            "3",
            "--federation.rounds",
            "500",
            "--logging.progress",
            "false",
            "--output_dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    run_dir = tmp_path / "fedavg_digits_a0.5_s0"
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "server.pt").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no round finished in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "terminated (SIGTERM)" in last and f"--resume {run_dir}" in last and "Traceback" not in err
    assert not (run_dir / ".lock").exists() and (run_dir / "checkpoints" / "server.pt").exists()


_FAILING_METHOD = r"""
import contextlib, io, json, sys
from dataclasses import dataclass
import torch
from fl_lightning import train
from fl_lightning.federation.algorithm import Algorithm, register


@dataclass
class AlwaysFailsConfig:
    pass


@register("always_fails")
class AlwaysFails(Algorithm):
    config_class = AlwaysFailsConfig

    def initial_state(self):
        return {"w": torch.zeros(1)}

    def client_update(self, round_idx, client, download):
        raise RuntimeError(f"boom on client {client.index if hasattr(client, 'index') else '?'}")

    def aggregate(self, round_idx, state, uploads, failures, plan):
        return state

    def evaluate(self, state):
        return {"accuracy": 0.0}


results = {}
for name, extra in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = train.main([*json.loads(sys.argv[2]), "--run_name", name, *extra])
    results[name] = {"rc": rc, "stderr": err.getvalue()}
print(json.dumps(results))
"""


def test_failed_clients_end_the_run_with_exit_1_and_one_line(tmp_path):
    """Failure is never reported as success: a failing client under `raise`, and every client failing under
    `skip` (fewer than federation.min_clients succeed), are one line and exit 1; the checkpoint folder stays."""
    base = [
        "--config",
        TINY,
        "--algorithm",
        "always_fails",
        "--partition.num_clients",
        "3",
        "--logging.progress",
        "false",
        "--output_dir",
        str(tmp_path),
    ]
    cases = {
        "raise": [],
        "skip": ["--federation.on_client_error", "skip"],
        "debug": ["--federation.on_client_error", "skip", "--debug"],
        "raise_debug": ["--debug"],
    }
    proc = subprocess.run(
        [sys.executable, "-c", _FAILING_METHOD, json.dumps(cases), json.dumps(base)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, needles in (
        ("raise", ["client 0 failed in round 0", "boom", "on_client_error: skip"]),
        ("skip", ["round 0: 0 of 3 clients succeeded", "federation.min_clients=1", "boom"]),
    ):
        lines = r[name]["stderr"].strip().splitlines()
        assert r[name]["rc"] == 1 and len(lines) == 1 and "Traceback" not in r[name]["stderr"], r[name]
        assert all(n in lines[0] for n in needles), lines[0]
        assert "checkpoint kept in" in lines[0] and not (tmp_path / name / "summary.json").exists()
    assert r["debug"]["rc"] == 1 and "Traceback" in r["debug"]["stderr"]
    # --debug shows the cause, not only the one line: the client's own traceback, down to the method's code
    for name in ("debug", "raise_debug"):
        err = r[name]["stderr"]
        assert r[name]["rc"] == 1 and 'File "<string>", line 22, in client_update' in err, err  # the method's own line
        assert "The above exception was the direct cause of the following exception" in err, err
        assert err.strip().splitlines()[-1].startswith("fl_lightning: "), err  # the one line still comes last
    assert "TooFewClients" in r["debug"]["stderr"] and "ClientFailure" in r["raise_debug"]["stderr"]


def test_a_run_failure_is_caught_by_its_class(monkeypatch, capsys):
    """main() knows RunFailure from fl_lightning.errors (no lookup of the simulation module): one line, exit 1,
    and a UsageError raised as deep stays one line, exit 2, without --debug."""
    from fl_lightning import train
    from fl_lightning.errors import ClientUsageError, RunFailure
    from fl_lightning.experiments import runner

    for err, status in (
        (RunFailure("round 3: the server gave up"), 1),
        (ClientUsageError("client 2 in round 0: corrupt image x.png", 2, 0, "Traceback ...\n"), 2),
    ):

        def fail(args, argv, locks, collector, err=err):
            raise err

        monkeypatch.setattr(runner, "run", fail)
        assert train.main(["--config", TINY]) == status
        assert capsys.readouterr().err.splitlines() == [f"fl_lightning: {err}"]


def test_a_run_recorded_before_a_key_was_added_resumes_under_the_value_it_ran_with(tmp_path):
    """A run folder written before ``federation.matmul_precision``/``deterministic`` existed (its run.json and
    config.yaml lack them) resumes with ``--resume`` under torch's defaults of then, and its config is not
    reported as changed."""
    import yaml

    base = ["--config", TINY, "--partition.num_clients", "3", "--logging.progress", "false"]
    first = run_cli(*base, "--federation.rounds", "1", "--output_dir", str(tmp_path))
    assert first.returncode == 0, first.stderr[-2000:]
    run_dir = tmp_path / "fedavg_digits_a0.5_s0"
    record = json.loads((run_dir / "run.json").read_text())
    for key in ("matmul_precision", "deterministic"):  # as an older version wrote them
        del record["config"]["federation"][key]
    (run_dir / "run.json").write_text(json.dumps(record))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    for key in ("matmul_precision", "deterministic"):
        config["federation"].pop(key, None)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    again = run_cli("--resume", str(run_dir), "--federation.rounds", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    resumed = yaml.safe_load((run_dir / "config.yaml").read_text())["federation"]
    assert (resumed["matmul_precision"], resumed["deterministic"]) == ("highest", False)
