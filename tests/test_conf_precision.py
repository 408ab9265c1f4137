"""The precision each config under conf/ names: the papers' real-size (GPU) configs bf16-mixed, the tiny/CPU ones
(the bundled digits: quickstart, *_tiny, the offline digits comparisons) the 32-true reference."""

from __future__ import annotations

import pytest

from fl_lightning.config import FederationConfig
from fl_lightning.config.loading import load_config
from fl_lightning.config.yaml_io import read_config
from tests.conftest import CONF

_CONFIGS = sorted(CONF.glob("*.yaml"))


def _precisions(raw: dict) -> set[str]:
    """The precision of the config and of each of its variants (the default where none is named)."""
    base = (raw.get("federation") or {}).get("precision", FederationConfig().precision)
    variants = raw.get("variants") or []
    named = {
        ((v.get("overrides") or v).get("federation") or {}).get("precision")
        for v in (variants.values() if isinstance(variants, dict) else variants)
        if isinstance(v, dict)
    }
    return {base} | {p for p in named if p is not None}


def _is_gpu_config(raw: dict, name: str) -> bool:
    return (raw.get("data") or {}).get("name") != "digits" and "tiny" not in name and name != "quickstart.yaml"


def test_the_split_is_the_one_intended():
    gpu = {p.name for p in _CONFIGS if _is_gpu_config(read_config(p), p.name)}
    assert {
        "fedopal_cifar10.yaml",
        "fedopal_table2_dtd.yaml",
        "afl_svhn.yaml",
        "fedisyn_food101.yaml",
        "fedisyn_compare_cifar10.yaml",
    } <= gpu
    assert not gpu & {"quickstart.yaml", "fedopal_digits_tiny.yaml", "fedopal_kd_baselines_digits.yaml"}
    assert len(gpu) == 19, sorted(gpu)


@pytest.mark.parametrize("path", _CONFIGS, ids=lambda p: p.name)
def test_paper_gpu_configs_name_bf16_mixed_and_tiny_ones_32_true(path):
    raw = read_config(path)
    expected = "bf16-mixed" if _is_gpu_config(raw, path.name) else "32-true"
    assert _precisions(raw) == {expected}, (path.name, _precisions(raw))


@pytest.mark.parametrize("name", ["fedopal_cifar10.yaml", "afl_femnist_natural.yaml", "fedopal_table2_svhn.yaml"])
def test_every_run_a_gpu_config_expands_to_is_bf16_mixed(name):
    from fl_lightning.experiments.plan import plan_runs

    runs = plan_runs(load_config(CONF / name))  # variants merge into the base: their federation keys keep it
    assert runs and {r.federation.precision for r in runs} == {"bf16-mixed"}
