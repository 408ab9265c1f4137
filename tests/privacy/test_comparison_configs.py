"""The accuracy-against-ε comparisons: every variant loads, the tiny ones run, and the curve script reads them."""

from __future__ import annotations

import csv
import importlib.util
import json
import math

import pytest

pytest.importorskip("dp_accounting")  # the 'privacy' extra

from fl_lightning import train  # noqa: E402
from fl_lightning.config.loading import load_config  # noqa: E402
from fl_lightning.config.variants import expand_variants  # noqa: E402
from tests.conftest import CONF, REPO  # noqa: E402


def _curve_module():
    spec = importlib.util.spec_from_file_location("privacy_curve", REPO / "scripts" / "privacy_curve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["privacy_fedopal_tiny.yaml", "privacy_fedavg_tiny.yaml"])
def test_every_variant_loads_with_its_privacy(name):
    runs = expand_variants(load_config(CONF / name))
    mechanisms = [r.federation.privacy.mechanism for r in runs]
    assert "off" in mechanisms and len(set(mechanisms)) == 2 and len({r.run_name for r in runs}) == len(runs)


def test_the_tiny_dp_fedavg_sweep_runs_and_the_curve_reads_it(tmp_path, capsys):
    rc = train.main(
        ["--config", str(CONF / "privacy_fedavg_tiny.yaml"), "--output_dir", str(tmp_path), "--federation.rounds", "1"]
    )
    assert rc == 0, capsys.readouterr().err
    sigmas = {p.parent.name: json.loads(p.read_text()).get("noise_multiplier") for p in tmp_path.glob("*/summary.json")}
    assert sigmas["fedavg_off"] is None and sigmas["fedavg_eps10"] > sigmas["fedavg_eps50"] > 0
    rows = _curve_module().write_curve(tmp_path)
    assert [r["epsilon"] for r in rows][-1] == math.inf and rows[0]["epsilon"] == pytest.approx(10, rel=0.01)
    with (tmp_path / "privacy_curve.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 3
    assert (tmp_path / "privacy_curve.png").stat().st_size > 1000
    assert "FedAvg ε=10" in (tmp_path / "comparison.md").read_text()
