"""The pilots' command line: fit the scaling law to pilot runs, print κ and λ*, plot H(λ)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fl_lightning.algorithms.fedisyn.pilots import main
from fl_lightning.systems.scaling_law import optimal_lambda
from tests.systems.test_scaling_law import H0, TRUE, _pilots

REPO = Path(__file__).resolve().parents[2]


def _write_pilots(path: Path, noise: float = 0.002) -> None:
    lam, acc, H = _pilots(noise)
    rows = "".join(f"{a},{b},{c}\n" for a, b, c in zip(lam, acc, H))
    path.write_text("lambda,accuracy,time_s\n" + rows)


def test_cli_prints_kappas_and_lambda_star_and_writes_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pilots, png = tmp_path / "pilots.csv", tmp_path / "h.png"
    _write_pilots(pilots)
    code = main(["--pilots", str(pilots), "--target-accuracy", "0.8", "--h0", str(H0), "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert all(f"kappa{k}=" in out for k in range(1, 5))
    printed = float(out.split("lambda*=")[1].split()[0])
    assert printed == pytest.approx(optimal_lambda(0.8, h0=H0, params=TRUE), rel=0.03)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_as_a_module(tmp_path: Path) -> None:
    pilots = tmp_path / "pilots.csv"
    _write_pilots(pilots)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fl_lightning.algorithms.fedisyn.pilots",
            "--pilots",
            str(pilots),
            "--target-accuracy",
            "0.8",
            "--h0",
            str(H0),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "lambda*=" in proc.stdout
    assert proc.stderr == ""  # no runpy warning from the package importing the module early


@pytest.mark.parametrize(
    "content, args",
    [
        (None, []),  # missing file
        ("lambda,acc,time_s\n0.1,0.5,10\n", []),  # wrong header
        ("lambda,accuracy,time_s\n0.1,high,10\n", []),  # not a number
        ("lambda,accuracy,time_s\n0.1,0.5,10\n0.2,0.5,9\n", []),  # too few pilots
        ("lambda,accuracy,time_s\n", ["--h0", "abc"]),  # bad flag value
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | None, args: list[str]
) -> None:
    pilots = tmp_path / "pilots.csv"
    if content is not None:
        pilots.write_text(content)
    argv = ["--pilots", str(pilots), "--target-accuracy", "0.8", "--h0", "10"] + args
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1


# -- synthetic_lambda: auto --------------------------------------------------------------------------
def _fake_pilot_runs(root: Path, h0: float) -> list[Path]:
    """Pilot run folders (summary.json + metrics.csv) whose rounds follow the known law TRUE exactly."""
    import json
    import math

    from fl_lightning.systems.scaling_law import total_time

    D, epochs = 1000, 2
    runs = []
    for lam in (0.02, 0.05, 0.1, 0.2, 0.5):
        run = root / f"pilot_lam{lam:g}"
        run.mkdir(parents=True)
        images = round(lam * D)
        # charge h0 = (ĥ + h̃ T̂) D with ĥ = h̃ T̂ = h0 / (2 D)
        summary = {
            "lambda": lam,
            "synthetic_images": images,
            "real_samples": D,
            "simulated_generation_s": h0 / (2 * D) * images,
            "simulated_pretraining_s": h0 / (2 * D) * images,
        }
        (run / "summary.json").write_text(json.dumps(summary))
        rows = ["round,accuracy,simulated_time_s"]
        for r, acc in enumerate((0.55, 0.65, 0.75, 0.85)):
            rows.append(f"{r},{acc},{float(total_time(lam, acc, h0=h0, params=TRUE))!r}")
        (run / "metrics.csv").write_text("\n".join(rows) + "\n")
        assert math.isclose(h0 / (2 * D) * images / (images * epochs) * epochs, h0 / (2 * D))
        runs.append(run)
    return runs


def test_auto_lambda_picks_the_minimiser_of_a_known_eq13(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``synthetic_lambda: auto``: pilots → Eq. (13) fit → λ*, which is the minimiser of the known H(λ, Acc)
    (checked against a bounded scalar minimisation of the true law, independent of the closed form)."""
    import math

    from scipy.optimize import minimize_scalar

    from fl_lightning.algorithms.synthetic_family import pilots, synthesis_step
    from fl_lightning.config.loading import load_config
    from fl_lightning.errors import ConfigError
    from fl_lightning.systems.scaling_law import total_time
    from tests.conftest import CONF

    cfg = load_config(
        CONF / "fedisyn_tiny.yaml",
        ["--fedisyn.synthetic_lambda", "auto", "--fedisyn.pretrain_epochs", "2", "--fedisyn.target_accuracy", "0.8"],
    )
    assert cfg.method.synthetic_lambda == "auto"
    asked = []

    def fake_runs(run_dir, section, lambdas, *, rounds, cuda_device=None, round0_root=None):
        asked.append((section, list(lambdas), rounds, cuda_device))
        return _fake_pilot_runs(Path(run_dir) / "pilots", H0)

    monkeypatch.setattr(pilots, "run_pilot_processes", fake_runs)
    lam, fit = synthesis_step._auto_lambda(cfg.method, run_dir=tmp_path, section="fedisyn")
    assert asked == [("fedisyn", cfg.method.pilot_lambdas, cfg.method.pilot_rounds, None)]  # no CUDA here
    best = minimize_scalar(
        lambda u: float(total_time(math.exp(u), 0.8, h0=H0, params=TRUE)),
        bounds=(-8.0, 4.0),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert lam == pytest.approx(math.exp(best.x), rel=1e-4)
    assert lam == pytest.approx(optimal_lambda(0.8, h0=H0, params=TRUE), rel=1e-6)
    assert fit.h0 == pytest.approx(H0) and fit.params.kappa2 == pytest.approx(TRUE.kappa2, rel=1e-4)

    # pilots whose fit has no minimum (time grows with λ only) are one clear ConfigError, not a silent λ
    def flat_runs(run_dir, section, lambdas, *, rounds, cuda_device=None, round0_root=None):
        runs = _fake_pilot_runs(Path(run_dir) / "flat", H0)
        for run in runs:
            lines = (run / "metrics.csv").read_text().splitlines()
            (run / "metrics.csv").write_text("\n".join([lines[0]] + [f"{i},0.5,{1000.0 + i}" for i in range(4)]) + "\n")
        return runs

    monkeypatch.setattr(pilots, "run_pilot_processes", flat_runs)
    with pytest.raises(ConfigError) as err:
        synthesis_step._auto_lambda(cfg.method, run_dir=tmp_path, section="fedisyn")
    assert err.value.key == "fedisyn.synthetic_lambda"
