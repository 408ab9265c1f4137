"""docs/results.yaml is the one registry of result numbers: the paper pages show its rendering, every config and
command it names exists, and the paper's own numbers it holds are the ones the code is calibrated against."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("results_registry", REPO / "scripts" / "results_registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def registry(script):
    return script.load_registry()


def _ids(registry) -> set[str]:
    ids = set()
    for paper, section in registry.items():
        ids |= {f"{paper}.{name}" for name in ("paper_scale", "paper_food101") if name in section}
        ids |= {f"{paper}.{entry['id']}" for entry in section.get("measured") or []}
    return ids


def test_the_pages_show_the_registrys_rendering_of_every_entry(script, registry):
    assert not script.stale_blocks(registry), "python scripts/results_registry.py --write"
    shown = {m.group(2) for page in script.PAGES.values() for m in script.BLOCK.finditer(page.read_text())}
    assert shown == _ids(registry) and {"fedopal.paper_scale", "fedisyn.paper_scale", "fedisyn.paper_food101"} <= shown


def test_a_changed_number_makes_its_page_stale(script, registry):
    """The check can fail: one cell edited in a copy of the registry is reported, naming its block."""
    import copy

    edited = copy.deepcopy(registry)
    edited["fedopal"]["measured"][0]["rows"][0][1] = "12.34 ± 0.00"
    assert script.stale_blocks(edited) == [f"docs/fedopal.md: fedopal.{edited['fedopal']['measured'][0]['id']}"]


def test_every_config_and_command_named_exists_and_no_number_is_unsourced(registry):
    for section in registry.values():
        for row in section["paper_scale"]["rows"]:
            assert (REPO / row["config"]).is_file(), row["config"]
            assert row["paper"] is None or isinstance(row["paper"], dict)
            assert row["measured"] is None or "command" in row["measured"]
        for entry in section.get("measured") or []:
            named = re.findall(r"conf/[\w.-]+\.yaml", entry["command"])
            assert entry["command"].startswith("python -m ") and named, entry["id"]
            assert all((REPO / n).is_file() for n in named), named
            assert entry["setting"] and all(len(r) == len(entry["columns"]) for r in entry["rows"])


def test_fedisyns_paper_numbers_are_the_calibrations():
    """The one copy in code (systems/calibration.py's FOOD101, which fits the channel) and the registry's agree."""
    import yaml

    from fl_lightning.systems.calibration import FOOD101

    table = yaml.safe_load((REPO / "docs" / "results.yaml").read_text())["fedisyn"]["paper_food101"]
    assert {r[0]: r[1] for r in table["rows"]} == dict(FOOD101.time_to_target_s)
    assert {r[0]: r[2] for r in table["rows"]} == dict(FOOD101.traffic_mb)
    assert f"{FOOD101.fedisyn_generation_s:,.0f} s" in table["source"]


def test_the_run_counts_shown_are_the_configs_plans(script, registry):
    """The runs column is computed from each config's plan (as --list-runs counts), not typed in."""
    page = (REPO / "docs" / "fedopal.md").read_text()
    assert "| `conf/fedopal_table2_cifar10.yaml` | CIFAR-10 | 144 |" in page
    assert script._planned_runs("conf/fedopal_table2_cifar10.yaml") == 144
