import math

import pytest

from fl_lightning.config import RunConfig, dump_config, load_config
from fl_lightning.errors import ConfigError, UsageError
from tests.conftest import CONF


def test_yaml_overrides_and_round_trip(tmp_path):
    cfg = load_config(CONF / "fedavg_digits_tiny.yaml", ["--partition.alpha", "0.01", "--federation.rounds=4"])
    assert cfg.partition.alpha == 0.01 and cfg.federation.rounds == 4
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


def test_inf_alpha_and_int_for_float():
    cfg = load_config(None, ["--partition.alpha", "inf", "--fedopal.lam", "0"])
    assert math.isinf(cfg.partition.alpha) and cfg.method.lam == 0.0 and isinstance(cfg.method.lam, float)
    assert cfg.resolved_run_name == "fedopal_digits_ainf_s0"


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        (["--partition.alpha", "0"], "partition.alpha", "> 0"),
        (["--partition.num_clients", "0"], "partition.num_clients", ">= 1"),
        (["--fedopal.mu", "-1"], "fedopal.mu", ">= 0"),
        (["--fedopal.lam", "-1e-3"], "fedopal.lam", ">= 0"),
        (["--fedopal.num_prompts", "0"], "fedopal.num_prompts", ">= 1 (no prompts: algorithm afl)"),
        (["--algorithm", "afl", "--afl.lam", "-1"], "afl.lam", ">= 0"),
        (["--federation.client_fraction", "1.5"], "federation.client_fraction", "(0, 1]"),
        (["--federation.client_fraction", "0"], "federation.client_fraction", "(0, 1]"),
        (["--federation.rounds", "many"], "federation.rounds", "an int"),
        (["--data.name", "cifar11"], "data.name", "did you mean 'cifar10'"),
        (["--algorithm", "fedopl"], "algorithm", "did you mean 'fedopal'"),
        (["--model.library", "keras"], "model.library", "'open_clip', 'timm'"),
    ],
)
def test_bad_values_name_key_value_and_allowed(override, key, allowed):
    with pytest.raises(ConfigError) as err:
        load_config(None, override)
    msg = str(err.value)
    assert key in msg and allowed in msg and "\n" not in msg


def test_unknown_key_suggests():
    with pytest.raises(UsageError, match=r"unknown key 'partition.alpa' \(did you mean 'partition.alpha'\?\)"):
        load_config(None, ["--partition.alpa", "1"])
    with pytest.raises(UsageError, match="unknown key 'federaton'"):
        load_config(None, ["--federaton.rounds", "1"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(bad)


def test_defaults_are_paper_settings():
    cfg = load_config(None)
    assert (cfg.fedopal.num_prompts, cfg.fedopal.mu, cfg.fedopal.lam, cfg.train.epochs) == (10, 0.1, 1e-6, 5)
    assert RunConfig().method is None  # the method's section comes from the loader


def test_a_method_section_belongs_to_its_method():
    with pytest.raises(UsageError, match="fedavg: section given but algorithm is fedopal"):
        load_config(None, ["--fedavg.weighted", "false"])
    # --algorithm on a file written for another method: the section of the method it extends carries over
    cfg = load_config(CONF / "quickstart.yaml", ["--algorithm", "afl", "--afl.lam", "0.5"])
    assert cfg.algorithm == "afl" and cfg.method.lam == 0.5 and not hasattr(cfg.method, "mu")


def test_a_variant_that_switches_method_keeps_the_new_methods_own_defaults():
    """FedOPAL+ extends FedOPAL's config but defaults restat to global: a base fedopal section (resolved,
    every default written out) must not hand it FedOPAL's restat: local. Set keys carry over."""
    from fl_lightning.config import expand_variants

    variants = "[{algorithm: fedopal_plus}, {algorithm: fedopal_plus, run_name: p_local, fedopal_plus: {restat: local}}]"
    runs = expand_variants(load_config(CONF / "quickstart.yaml", ["--variants", variants, "--fedopal.mu", "0.3"]))
    assert [(r.method.restat, r.method.mu) for r in runs] == [("global", 0.3), ("local", 0.3)]
    cfg = load_config(CONF / "quickstart.yaml", ["--algorithm", "fedopal_plus"])
    assert cfg.method.restat == "global"


def test_print_config_shows_only_the_runs_own_section(tmp_path):
    text = dump_config(load_config(CONF / "fedavg_digits_tiny.yaml"))
    sections = [line.rstrip(":") for line in text.splitlines() if line and not line.startswith((" ", "-"))
                and line.endswith(":")]
    assert sections == ["variants", "sweep", "data", "partition", "model", "federation", "train", "logging",
                        "fedavg"] or sections == ["data", "partition", "model", "federation", "train", "logging",
                                                  "fedavg"]


def test_variants_cross_methods_and_sweeps():
    from fl_lightning.config import expand_variants

    cfg = load_config(CONF / "quickstart.yaml", ["--sweep", "{partition.alpha: [0.1, .inf], seed: [0, 1]}"])
    runs = expand_variants(cfg)
    assert len(runs) == 3 * 4 and len({r.resolved_run_name for r in runs}) == 12
    assert {(r.algorithm, r.label) for r in runs} == {("afl", "afl"), ("fedopal", "fedopal"),
                                                      ("fedopal", "fedopal_restat_global_digits")}
    assert {r.method.restat for r in runs if r.label == "fedopal_restat_global_digits"} == {"global"}
    with pytest.raises(UsageError, match=r"variants\[1\]"):
        expand_variants(load_config(CONF / "quickstart.yaml",
                                    ["--variants", "[{algorithm: afl}, {fedopal: {mu: -1}}]"]))


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_expands(path):
    from fl_lightning.config import expand_variants

    runs = expand_variants(load_config(path))
    assert runs and len({r.resolved_run_name for r in runs}) == len(runs)
