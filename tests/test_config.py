import ast
import math
import subprocess
import sys

import pytest
import yaml

from fl_lightning.config import RunConfig
from fl_lightning.config.loading import build_config, dump_config, load_config
from fl_lightning.config.variants import expand_variants
from fl_lightning.errors import ConfigError, UsageError
from tests.conftest import CONF, REPO


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
        # Flower's strategy names point to the policy key, not to a method spelled alike (fedadam is no feddyn)
        (["--algorithm", "fedadam"], "algorithm", "set federation.server_optimizer.name=fedadam beside a method"),
        (["--algorithm", "krum"], "algorithm", "set federation.aggregator.name=krum beside a method"),
        (["--algorithm", "FedMedian"], "algorithm", "set federation.aggregator.name=median beside a method"),
        (["--federation.server_optimizer", "fedadam"], "federation.server_optimizer", "federation.server_optimizer.name=fedadam"),
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
    assert (cfg.method.num_prompts, cfg.method.mu, cfg.method.lam, cfg.train.epochs) == (10, 0.1, 1e-6, 5)
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
    from fl_lightning.config.variants import expand_variants

    variants = (
        "[{algorithm: fedopal_plus}, {algorithm: fedopal_plus, run_name: p_local, "
        "fedopal_plus: {restat: local, val_fraction: 0}}]"
    )
    runs = expand_variants(load_config(CONF / "quickstart.yaml", ["--variants", variants, "--fedopal.mu", "0.3"]))
    assert [(r.method.restat, r.method.mu) for r in runs] == [("global", 0.3), ("local", 0.3)]
    cfg = load_config(CONF / "quickstart.yaml", ["--algorithm", "fedopal_plus"])
    assert cfg.method.restat == "global"


def test_print_config_shows_only_the_runs_own_section(tmp_path):
    text = dump_config(load_config(CONF / "fedavg_digits_tiny.yaml"))
    sections = [line.rstrip(":") for line in text.splitlines() if line and not line.startswith((" ", "-")) and line.endswith(":")]
    assert sections == [
        "variants",
        "sweep",
        "data",
        "partition",
        "model",
        "federation",
        "train",
        "logging",
        "fedavg",
    ] or sections == ["data", "partition", "model", "federation", "train", "logging", "fedavg"]


def test_variants_cross_methods_and_sweeps():
    from fl_lightning.config.variants import expand_variants

    cfg = load_config(CONF / "quickstart.yaml", ["--sweep", "{partition.alpha: [0.1, .inf], seed: [0, 1]}"])
    runs = expand_variants(cfg)
    assert len(runs) == 3 * 4 and len({r.resolved_run_name for r in runs}) == 12
    assert {(r.algorithm, r.label) for r in runs} == {
        ("afl", "AFL"),
        ("fedopal", "FedOPAL"),
        ("fedopal", "FedOPAL, restat: global"),
    }
    assert {r.method.restat for r in runs if r.label == "FedOPAL, restat: global"} == {"global"}
    with pytest.raises(UsageError, match=r"variants\[1\]"):
        expand_variants(load_config(CONF / "quickstart.yaml", ["--variants", "[{algorithm: afl}, {fedopal: {mu: -1}}]"]))


def test_keys_joined_by_commas_vary_together_in_a_sweep():
    """ "seed,partition.seed": [[0, 0], [1, 1]] is 2 points (not 4), crossed with the other keys; the group's
    first key names the run (the default name already encodes the seed)."""
    import itertools

    from fl_lightning.config.variants import expand_variants

    sweep = '{partition.alpha: [0.1, .inf], "seed,partition.seed": [[0, 0], [1, 1], [2, 7]]}'
    runs = expand_variants(load_config(CONF / "fedavg_digits_tiny.yaml", ["--sweep", sweep]))
    expected = list(itertools.product([0.1, math.inf], [(0, 0), (1, 1), (2, 7)]))
    assert [(r.partition.alpha, (r.seed, r.partition.seed)) for r in runs] == expected
    assert [r.resolved_run_name for r in runs] == [f"fedavg_digits_a{a}_s{s}" for a in ("0.1", "inf") for s in (0, 1, 2)]


@pytest.mark.parametrize(
    "sweep, needle",
    [
        ('{"seed,partition.seed": [[0, 0], [1]]}', "sweep.seed,partition.seed=[1]"),
        ('{"seed,partition.seed": [0, 1]}', "a list of 2 values, one for each of seed, partition.seed"),
        ('{"seed,partition.seed": []}', "a non-empty list"),
        ('{"seed,": [[0, 0]]}', "none of them empty"),
        ('{seed: [0, 1], "seed,partition.seed": [[0, 0]]}', "key 'seed' is swept twice"),
        ('{"seed,seed": [[0, 0]]}', "key 'seed' is swept twice"),
        ('{"seed,partition.sed": [[0, 0]]}', "did you mean 'partition.seed'"),
    ],
)
def test_a_bad_sweep_group_is_one_line(sweep, needle):
    from fl_lightning.config.variants import expand_variants

    with pytest.raises(UsageError) as err:
        expand_variants(load_config(CONF / "fedavg_digits_tiny.yaml", ["--sweep", sweep]))
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_every_shipped_sweep_of_seeds_gives_each_seed_its_own_partition():
    from fl_lightning.config.variants import expand_variants

    swept = [p for p in sorted(CONF.glob("*.yaml")) if "seed" in str(load_config(p).sweep)]
    assert len(swept) >= 6, swept
    for path in swept:
        runs = expand_variants(load_config(path))
        assert all(r.partition.seed == r.seed for r in runs), path.name
    for name in ("cifar10", "cifar100", "dtd", "svhn", "dinov2_digits"):  # the paper's α grid
        alphas = {r.partition.alpha for r in expand_variants(load_config(CONF / f"fedopal_table2_{name}.yaml"))}
        assert alphas == {0.01, 0.1, 1.0, 10.0}, name


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_expands(path):
    from fl_lightning.config.variants import expand_variants

    runs = expand_variants(load_config(path))
    assert runs and len({r.resolved_run_name for r in runs}) == len(runs)


def test_the_method_section_has_one_route():
    """cfg.method (self.config inside the method) is the one way to the method's section: RunConfig has no
    attribute named after the method."""
    cfg = load_config(CONF / "quickstart.yaml")
    assert cfg.algorithm == "fedopal" and cfg.method.mu == 0.1
    with pytest.raises(AttributeError):
        cfg.fedopal  # noqa: B018


@pytest.fixture
def renamed_hint():
    """The former-name hint prints once per name and process: start each test with none printed."""
    from fl_lightning.config.history import _hint_renamed

    _hint_renamed.cache_clear()
    yield
    _hint_renamed.cache_clear()


def _hints(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "is now called" in line]


@pytest.mark.parametrize(
    "old, new, conf",
    [
        ("fedavg_clip", "fedavg_prompts", "fedavg_prompts_digits_tiny.yaml"),
        ("fedavg_resnet", "fedavg_cnn", "fedavg_cnn_digits_tiny.yaml"),
    ],
)
def test_a_former_method_name_still_resolves_and_names_the_new_one(old, new, conf, renamed_hint, capsys):
    values = yaml.safe_load((CONF / conf).read_text())
    values["algorithm"] = old
    if new in values:  # the section under the former name too, as configs written before the rename have it
        values[old] = values.pop(new)
    cfg = build_config(values)
    assert cfg.algorithm == new and cfg == load_config(CONF / conf)
    assert cfg.resolved_run_name.startswith(f"{new}_")
    assert _hints(capsys) == [
        f"fl_lightning: method {old!r} is now called {new!r}; the old name still works, but "
        f"use {new!r} (algorithm: {new}, section {new}:)"
    ]
    build_config(values)
    assert _hints(capsys) == []  # once per process, however many runs a comparison builds
    # the command line and a comparison's variants take the former name as well
    assert load_config(CONF / "fedavg_digits_tiny.yaml", ["--algorithm", old]).algorithm == new
    runs = expand_variants(load_config(CONF / "fedavg_digits_tiny.yaml", ["--variants", f"[{{algorithm: {old}}}]"]))
    assert [r.algorithm for r in runs] == [new]
    values[new], values[old] = {}, values.get(old) or {}
    with pytest.raises(UsageError, match=f"sections '{old}' and '{new}' both given"):
        build_config(values)


def test_the_renamed_prompt_section_keeps_its_values(renamed_hint, capsys):
    cfg = load_config(CONF / "fedavg_prompts_digits_tiny.yaml", ["--fedavg_clip.num_prompts", "3"])
    assert cfg.algorithm == "fedavg_prompts" and cfg.method.num_prompts == 3
    assert len(_hints(capsys)) == 1


def _python_c(code: str) -> None:
    """``python -c code`` in a fresh interpreter at the repository's root; asserts it exits 0 (its stderr if not)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_importing_the_config_imports_no_method():
    """The loader reads the registry on first use; importing it (the schema, the loader and its helpers)
    imports neither the registry nor a method (nor torch), so the arrow config → registry has no way back."""
    code = (
        "import sys, fl_lightning.config, fl_lightning.config.loading, fl_lightning.config.variants; "
        "bad = sorted(m for m in sys.modules if m.startswith(('fl_lightning.algorithms', "
        "'fl_lightning.federation')) or m == 'torch'); assert not bad, bad"
    )
    _python_c(code)


def test_a_mistake_in_a_core_section_is_refused_before_any_method_is_imported():
    """The core sections are checked with the schema alone (config/loading.check_core_sections): the one line comes
    before the registry imports the methods (Lightning, the models: seconds on a loaded machine)."""
    code = (
        "import sys; from fl_lightning.config.loading import load_config; from fl_lightning.errors import ConfigError\n"
        "try:\n    load_config(None, ['--partition.alpha', '-1'])\nexcept ConfigError as err:\n"
        "    assert 'partition.alpha=-1.0' in str(err), err\nelse:\n    raise SystemExit('not refused')\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('fl_lightning.algorithms', 'lightning'))); assert not bad, bad"
    )
    _python_c(code)


def test_the_schema_alone_imports_no_loader():
    """``import fl_lightning.config`` (the package: the schema) imports none of the package's other modules and no
    YAML, and offers no loader name: ``load_config`` and the rest are imported from ``fl_lightning.config.loading``,
    which imports the registry, whose modules import the schema (a re-export would close a circle)."""
    code = (
        "import sys, fl_lightning.config; "
        "bad = sorted(m for m in sys.modules if m.startswith(('fl_lightning.config.', 'yaml')) "
        "and m != 'fl_lightning.config.schema'); assert not bad, bad"
    )
    _python_c(code)
    import fl_lightning.config as config

    for name in ("load_config", "build_config", "dump_config", "config_to_dict"):
        assert name not in vars(config), name


# The one module under algorithms/ that loads configs: FeDiSyn's pilot tool (its command line and the notebook's
# in-process pilot runs), which runs whole configs as train.py does. No method imports it: the pilots that
# ``synthetic_lambda: auto`` starts are synthetic_family/pilots.py, which does not load configs.
_CONFIG_DRIVERS = {"algorithms/fedisyn/pilots.py"}


def _runtime_imports(path) -> set[str]:
    """The fl_lightning modules ``path`` imports when it runs (imports inside ``if TYPE_CHECKING:`` excluded)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.startswith("fl_lightning")}


def test_the_registry_and_the_methods_do_not_import_the_config():
    """config/loading.py → algorithms/ (discovery) → federation/algorithm.py (registry) and never back — not to
    the loader, its helpers or the schema, not even through an import inside a function: a method's config
    checks use fl_lightning.errors.check."""
    package = REPO / "fl_lightning"
    paths = [package / "federation" / "algorithm.py", *sorted((package / "algorithms").rglob("*.py"))]
    offenders = [
        str(p.relative_to(package))
        for p in paths
        if any(m == "fl_lightning.config" or m.startswith("fl_lightning.config.") for m in _runtime_imports(p))
    ]
    assert sorted(set(offenders) - _CONFIG_DRIVERS) == []
    assert len(paths) > 15
    drivers = {m.replace("/", ".").removesuffix(".py") for m in _CONFIG_DRIVERS}
    importers = [
        str(p.relative_to(package)) for p in paths if any(m.removeprefix("fl_lightning.") in drivers for m in _runtime_imports(p))
    ]
    assert importers == []


def test_a_config_extends_its_base_and_states_only_what_differs(tmp_path):
    """``base: other.yaml`` (relative to the file): the base read first, this file merged over it — a section key by
    key, a list or value replaced — through a chain of bases; the result is the config written out whole."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text(
        "algorithm: fedavg\nseed: 3\ndata: {name: digits, batch_size: 16}\n"
        "partition: {num_clients: 4, alpha: 0.5}\nfederation: {rounds: 2}\n"
    )
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../root.yaml\ndata: {batch_size: 32}\nfederation: {rounds: 5}\n")
    (tmp_path / "sub" / "top.yaml").write_text("base: mid.yaml\npartition: {alpha: 2.0}\n")
    cfg = load_config(tmp_path / "sub" / "top.yaml", ["--federation.rounds", "7"])
    assert (cfg.seed, cfg.data.name, cfg.data.batch_size) == (3, "digits", 32)
    assert (cfg.partition.num_clients, cfg.partition.alpha, cfg.federation.rounds) == (4, 2.0, 7)
    assert "base" not in dump_config(cfg)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("base: missing.yaml\n", "'missing.yaml' not found"),
        ("base: loop.yaml\n", "extends itself through base"),
        ("base: [a.yaml]\n", "expected the path"),
    ],
)
def test_a_bad_base_is_one_line(tmp_path, content, words):
    (tmp_path / "loop.yaml").write_text(content)
    with pytest.raises(UsageError) as err:
        load_config(tmp_path / "loop.yaml", [])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_table_ii_on_each_data_set_is_the_cifar10_table_with_its_data_set():
    """Facts stated once: the four Table II configs are one table (cifar10's) and a data set each."""
    from fl_lightning.config.loading import config_to_dict
    from fl_lightning.experiments.plan import plan_runs

    table = load_config(CONF / "fedopal_table2_cifar10.yaml", [])
    for name in ("cifar100", "svhn", "dtd"):
        text = (CONF / f"fedopal_table2_{name}.yaml").read_text()
        assert "base: fedopal_table2_cifar10.yaml" in text and len(text.splitlines()) < 12
        same = load_config(
            CONF / "fedopal_table2_cifar10.yaml", ["--data.name", name, "--output_dir", f"runs/fedopal_table2_{name}"]
        )
        cfg = load_config(CONF / f"fedopal_table2_{name}.yaml", [])
        assert [config_to_dict(r) for r in plan_runs(cfg)] == [config_to_dict(r) for r in plan_runs(same)]
        assert len(plan_runs(cfg)) == len(plan_runs(table))
