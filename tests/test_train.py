"""The real CLI: exit codes and one-line errors (each case is a fresh process, as a user sees it)."""

import json

import pytest

from tests.conftest import CONF, run_cli

TINY = str(CONF / "fedavg_digits_tiny.yaml")
OPAL = str(CONF / "fedopal_digits_tiny.yaml")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--config", "does/not/exist.yaml"], "config file 'does/not/exist.yaml' not found"),
        ([], "--config FILE (or --resume RUN_DIR) is required"),
        (["--config", TINY, "--partition.alpa", "1"], "did you mean 'partition.alpha'"),
        (["--config", TINY, "--partition.alpha", "0"], "partition.alpha=0.0 is not allowed"),
        (["--config", TINY, "--partition.num_clients", "0"], "partition.num_clients=0"),
        (["--config", OPAL, "--fedopal.mu", "-1"], "fedopal.mu=-1.0"),
        (["--config", OPAL, "--fedopal.lam", "-1"], "fedopal.lam=-1.0"),
        (["--config", OPAL, "--fedopal.num_prompts", "-2"], "fedopal.num_prompts=-2"),
        (["--config", TINY, "--fedopal.mu", "0.5"], "fedopal: section given but algorithm is fedavg"),
        (["--config", TINY, "--federation.client_fraction", "2"], "(0, 1]"),
        (["--config", TINY, "--federation.rounds", "two"], "federation.rounds='two'"),
        (["--config", TINY, "--data.name", "imagenet22k"], "data.name='imagenet22k'"),
        (["--config", TINY, "--model.library", "keras"], "model.library='keras'"),
        (["--config", TINY, "--algorithm", "scaffold"], "algorithm='scaffold'"),
        (["--resume", "/nonexistent/run"], "no config.yaml there"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, needle):
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_missing_dataset_is_one_line(tmp_path):
    out = run_cli("--config", TINY, "--data.name", "cifar10", "--data.root", str(tmp_path / "nodata"),
                  "--output_dir", str(tmp_path / "runs"))
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
