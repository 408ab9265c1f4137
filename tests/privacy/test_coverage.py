"""Every (method, mechanism) pair is covered end to end or refused before the run starts, in one line naming what
would leak (exit 2); docs/privacy.md's table is the code's; a method's coverage is its own, never inherited."""

from __future__ import annotations

import re

import pytest

from fl_lightning.algorithms import available_algorithms
from fl_lightning.errors import UsageError
from fl_lightning.federation.algorithm import Algorithm
from fl_lightning.federation.policies.privacy_coverage import (
    MECHANISMS,
    check_privacy_coverage,
    coverage_table,
    privacy_gap,
)
from tests.conftest import CONF, REPO, run_cli

COVERED = {
    ("fedavg", "dp_fedavg"),
    ("fedprox", "dp_fedavg"),
    ("fedavg_cnn", "dp_fedavg"),
    ("fedavg_prompts", "dp_fedavg"),
    ("afl", "statistics_local"),
    ("afl", "statistics_central"),
    ("fedcgs", "statistics_local"),
    ("fedcgs", "statistics_central"),
}


def test_docs_privacy_holds_the_coverage_table_the_code_gives():
    page = (REPO / "docs" / "privacy.md").read_text()
    table = re.search(r"<!-- coverage table: generated -->\n(.*?)<!-- end of coverage table -->", page, re.S)
    assert table is not None and table.group(1) == coverage_table()


def test_the_covered_pairs_are_exactly_the_ones_audited():
    """The shipped methods' pairs (FedOPAL: covered only with DP-SGD on its prompts, which the table says)."""
    table = coverage_table()
    covered = set()
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = cells[0].strip("`")
        covered |= {(name, m) for m, cell in zip(MECHANISMS, cells[1:]) if cell == "covered"}
    assert covered == COVERED
    assert "| `fedopal` | refused" in table and table.count("covered with `dp_sgd: true`") == 2


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_every_refused_pair_is_one_line_naming_the_leak(mechanism):
    for name, algorithm in available_algorithms().items():
        if (name, mechanism) in COVERED or not algorithm.__module__.startswith("fl_lightning."):
            continue
        cfg = _config(name, mechanism)
        with pytest.raises(UsageError) as err:
            check_privacy_coverage(cfg, algorithm)
        line = str(err.value)
        assert "\n" not in line and f"does not protect {name}: " in line and "no ε would hold" in line


def _config(name: str, mechanism: str):
    from fl_lightning.federation.policies.privacy_coverage import _config

    return _config(name, available_algorithms()[name], mechanism, dp_sgd=False)


def test_coverage_is_never_inherited():
    """A subclass of a covered method (as DENSE is of FedAvgCNN) is refused until it declares its own."""
    fedavg = available_algorithms()["fedavg"]
    child = type("Child", (fedavg,), {"__module__": __name__})
    cfg = _config("fedavg", "dp_fedavg")
    assert privacy_gap(fedavg, cfg) is None and "does not declare" in privacy_gap(child, cfg)
    assert "privacy_gap" not in Algorithm.__dict__  # no default that would cover everything


def test_the_cli_refuses_an_uncovered_pair_before_anything_runs(tmp_path):
    proc = run_cli(
        "--config",
        str(CONF / "fedpft_digits_tiny.yaml"),
        "--output_dir",
        str(tmp_path),
        "--federation.privacy.mechanism",
        "statistics_central",
        "--federation.privacy.epsilon",
        "4",
        "--federation.privacy.delta",
        "1e-5",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not protect fedpft: it uploads Gaussian mixtures" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing started, nothing written
