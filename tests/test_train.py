"""The real CLI: exit codes and one-line errors (each case is a fresh process, as a user sees it)."""

import pytest

from tests.conftest import CONF, run_cli

TINY = str(CONF / "fedavg_digits_tiny.yaml")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--config", "does/not/exist.yaml"], "config file 'does/not/exist.yaml' not found"),
        ([], "--config FILE (or --resume RUN_DIR) is required"),
        (["--config", TINY, "--partition.alpa", "1"], "did you mean 'partition.alpha'"),
        (["--config", TINY, "--partition.alpha", "0"], "partition.alpha=0.0 is not allowed"),
        (["--config", TINY, "--partition.num_clients", "0"], "partition.num_clients=0"),
        (["--config", TINY, "--fedopal.mu", "-1"], "fedopal.mu=-1.0"),
        (["--config", TINY, "--analytic.lam", "-1"], "analytic.lam=-1.0"),
        (["--config", TINY, "--fedopal.num_prompts", "-2"], "fedopal.num_prompts=-2"),
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
