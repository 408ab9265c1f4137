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


def test_cli_prints_kappas_and_lambda_star_and_writes_the_plot(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    pilots, png = tmp_path / "pilots.csv", tmp_path / "h.png"
    _write_pilots(pilots)
    code = main(["--pilots", str(pilots), "--target-accuracy", "0.8", "--h0", str(H0),
                 "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert all(f"kappa{k}=" in out for k in range(1, 5))
    printed = float(out.split("lambda*=")[1].split()[0])
    assert printed == pytest.approx(optimal_lambda(0.8, h0=H0, params=TRUE), rel=0.03)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_as_a_module(tmp_path: Path) -> None:
    pilots = tmp_path / "pilots.csv"
    _write_pilots(pilots)
    proc = subprocess.run([sys.executable, "-m", "fl_lightning.algorithms.fedisyn.pilots", "--pilots",
                           str(pilots), "--target-accuracy", "0.8", "--h0", str(H0)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "lambda*=" in proc.stdout
    assert proc.stderr == ""  # no runpy warning from the package importing the module early


@pytest.mark.parametrize("content, args", [
    (None, []),  # missing file
    ("lambda,acc,time_s\n0.1,0.5,10\n", []),  # wrong header
    ("lambda,accuracy,time_s\n0.1,high,10\n", []),  # not a number
    ("lambda,accuracy,time_s\n0.1,0.5,10\n0.2,0.5,9\n", []),  # too few pilots
    ("lambda,accuracy,time_s\n", ["--h0", "abc"]),  # bad flag value
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                              content: str | None, args: list[str]) -> None:
    pilots = tmp_path / "pilots.csv"
    if content is not None:
        pilots.write_text(content)
    argv = ["--pilots", str(pilots), "--target-accuracy", "0.8", "--h0", "10"] + args
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1
