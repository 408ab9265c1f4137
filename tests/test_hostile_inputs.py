"""Hostile inputs through the real CLI (``fl_lightning.train.main``): exit status, exactly one line on
stderr, no traceback, and what the line names.

To stay fast on a small machine, every case runs in ONE fresh process (a driver that calls ``main``
once per case and captures its stderr), instead of one process per case; the CLI code path is the
same as ``python -m fl_lightning.train`` (tests/test_train.py checks that wiring in real processes).
Nearly every case fails before Fabric launches anything. A second driver process plays a run
folder's life: a run, a resume that would mix configurations, an edited config.yaml, a re-run into
the folder, ``--overwrite``, a stale and a live lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from tests.conftest import CONF, REPO

TINY = str(CONF / "fedavg_digits_tiny.yaml")
QUIET = ["--logging.progress", "false", "--partition.num_clients", "3", "--federation.rounds", "1"]

_DRIVER = r"""
import contextlib, io, json, sys, traceback
from pathlib import Path
from fl_lightning.train import main
results = []
for step in json.load(sys.stdin):
    if "replace" in step:
        path = Path(step["replace"])
        path.write_text(path.read_text().replace(step["old"], step["new"]))
        continue
    if "copy" in step:
        Path(step["to"]).write_bytes(Path(step["copy"]).read_bytes())
        continue
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(step["argv"])
    except SystemExit as e:
        rc = e.code
    except BaseException as e:  # an uncaught exception is what a user would see as a traceback
        rc = "uncaught"
        err.write("".join(traceback.format_exception(e)))
    results.append({"id": step["id"], "rc": rc, "stderr": err.getvalue()})
print(json.dumps(results))
"""


def drive(steps: list[dict], timeout: float = 600) -> dict[str, dict]:
    """Run ``steps`` (``{"id", "argv"}``, ``{"replace": path, "old", "new"}`` or ``{"copy": path, "to"}``)
    in one fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(steps),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}


def assert_one_line(result: dict, rc: int, *needles: str) -> str:
    lines = result["stderr"].strip().splitlines()
    assert result["rc"] == rc, result
    assert len(lines) == 1, result["stderr"][-3000:]
    assert "Traceback" not in result["stderr"]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ----------------------------------------------------------------------------- the table


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    (d / "a_file").write_text("not a folder\n")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "scalar.yaml").write_text("42\n")
    (d / "dup.yaml").write_text("seed: 1\nseed: 2\n")
    (d / "bad.yaml").write_text("data: [unclosed\n")
    (d / "a_dir.yaml").mkdir()
    (d / "bomb.yaml").write_text(alias_bomb())
    nested = yaml.safe_load(open(TINY))
    (d / "bomb_nested.yaml").write_text(
        yaml.safe_dump(nested, sort_keys=False).replace(
            "  overrides:\n", "  overrides:\n" + "".join(f"    {line}\n" for line in alias_bomb().splitlines()), 1
        )
    )
    (d / "recursive.yaml").write_text("model:\n  overrides: &a {x: [*a]}\n")
    vit = yaml.safe_load(open(TINY))  # a timm ViT whose input size is not fixed: 16 px patches (its name)
    vit["model"] = {
        "library": "timm",
        "name": "vit_base_patch16_224",
        "pretrained": None,
        "overrides": {"embed_dim": 32, "depth": 1, "num_heads": 2},
    }
    vit["data"]["image_size"] = 8
    (d / "vit_small_input.yaml").write_text(yaml.safe_dump(vit, sort_keys=False))
    (d / "notes.txt").write_text("these are not weights\n")
    (d / "empty.pt").write_bytes(b"")
    torch.save({"w": torch.zeros(64)}, d / "good.pt")
    (d / "truncated.pt").write_bytes((d / "good.pt").read_bytes()[:100])
    # a run folder whose server checkpoint is corrupt (its config.yaml need not be a resolved one)
    run = d / "runs" / "corrupt_run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = yaml.safe_load(open(TINY))
    cfg.update(run_name="corrupt_run", output_dir=str(d / "runs"))
    cfg["partition"]["num_clients"] = 3
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (run / "checkpoints" / "server.pt").write_bytes(b"PK\x03\x04 garbage")
    # a run folder in use by a live process
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    busy = d / "runs" / "busy"
    busy.mkdir(parents=True)
    stat = open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[-1].split()[19]
    (busy / ".lock").write_text(json.dumps({"pid": holder.pid, "start": stat, "host": os.uname().nodename, "since": "now"}))
    yield d
    holder.kill()
    holder.wait()


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs" in YAML: ``width ** levels`` strings from a few lines of aliases."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _cases(d) -> list[tuple[str, list[str], int, list[str]]]:
    """(id, argv, exit status, what the one line must name)."""
    out = ["--output_dir", str(d / "runs")]
    base = ["--config", TINY, *QUIET, *out]
    return [
        # usage
        ("no-args", [], 2, ["--config FILE (or --resume RUN_DIR) is required"]),
        ("config-twice", ["--config", TINY, "--config", TINY], 2, ["--config given twice"]),
        ("config-and-resume", ["--config", TINY, "--resume", str(d)], 2, ["--config and --resume together"]),
        ("resume-and-overwrite", ["--resume", str(d), "--overwrite"], 2, ["--overwrite and --resume"]),
        ("resume-moves-folder", ["--resume", str(d), "--run_name", "x"], 2, ["--run_name with --resume"]),
        ("resume-nothing", ["--resume", str(d / "nowhere")], 2, ["no config.yaml there"]),
        ("bad-override-token", ["--config", TINY, "seed", "1"], 2, ["expected --key value"]),
        # the config file
        ("config-missing", ["--config", str(d / "nope.yaml")], 2, ["nope.yaml' not found"]),
        ("config-dir", ["--config", str(d / "a_dir.yaml")], 2, ["is a directory"]),
        ("config-list", ["--config", str(d / "list.yaml")], 2, ["holds a list at the top level"]),
        ("config-scalar", ["--config", str(d / "scalar.yaml")], 2, ["holds a int at the top level"]),
        ("config-duplicate-key", ["--config", str(d / "dup.yaml")], 2, ["duplicate key 'seed'"]),
        ("config-not-yaml", ["--config", str(d / "bad.yaml")], 2, ["not valid YAML"]),
        ("alias-bomb", ["--config", str(d / "bomb.yaml")], 2, ["bomb.yaml' holds more than 100,000 values", "aliases"]),
        (
            "alias-bomb-print-config",
            ["--config", str(d / "bomb.yaml"), "--print-config"],
            2,
            ["bomb.yaml' holds more than 100,000 values"],
        ),
        (
            "alias-bomb-nested-print-config",
            ["--config", str(d / "bomb_nested.yaml"), "--print-config"],
            2,
            ["bomb_nested.yaml' holds more than 100,000 values"],
        ),
        (
            "alias-bomb-override",
            ["--config", TINY, "--model.overrides", "{" + alias_bomb().replace("\n", ", ") + "}", "--print-config"],
            2,
            ["--model.overrides holds more than 100,000 values"],
        ),
        (
            "alias-recursive",
            ["--config", str(d / "recursive.yaml"), "--print-config"],
            2,
            ["recursive.yaml' holds an alias (*name) inside the structure its anchor"],
        ),
        # keys and values
        ("unknown-key", [*base, "--partition.alpa", "1"], 2, ["did you mean 'partition.alpha'"]),
        ("alpha-zero", [*base, "--partition.alpha", "0"], 2, ["partition.alpha=0.0"]),
        ("alpha-nan", [*base, "--partition.alpha", "nan"], 2, ["partition.alpha"]),
        ("clients-zero", [*base, "--partition.num_clients", "0"], 2, ["partition.num_clients=0"]),
        ("rounds-word", [*base, "--federation.rounds", "two"], 2, ["federation.rounds='two'"]),
        ("fraction", [*base, "--federation.client_fraction", "2"], 2, ["(0, 1]"]),
        ("dataset", [*base, "--data.name", "imagenet22k"], 2, ["data.name='imagenet22k'"]),
        ("library", [*base, "--model.library", "keras"], 2, ["model.library='keras'"]),
        ("algorithm", [*base, "--algorithm", "no_such_method"], 2, ["algorithm='no_such_method'"]),
        ("other-method-section", [*base, "--fedopal.mu", "0.5"], 2, ["fedopal: section given but algorithm is"]),
        ("seed-negative", [*base, "--seed", "-1"], 2, ["seed=-1"]),
        ("seed-huge", [*base, "--seed", str(2**40)], 2, ["seed="]),
        ("precision", [*base, "--federation.precision", "banana"], 2, ["federation.precision='banana'"]),
        ("accelerator", [*base, "--federation.accelerator", "quantum"], 2, ["federation.accelerator='quantum'"]),
        ("strategy", [*base, "--federation.strategy", "banana"], 2, ["federation.strategy='banana'", "Fabric"]),
        ("strategy-spawn", [*base, "--federation.strategy", "ddp_spawn"], 2, ["federation.strategy='ddp_spawn'"]),
        (
            "precision-missing-lib",
            [*base, "--federation.precision", "transformer-engine"],
            2,
            ["federation.precision='transformer-engine'"],
        ),
        # values that pass the types but fail at run time
        ("lr-inf", [*base, "--train.lr", "inf"], 2, ["train.lr=inf"]),
        ("lr-overflow", [*base, "--train.lr", "1e300"], 2, ["train.lr=1e+300", "float32"]),
        ("momentum", [*base, "--train.momentum", "-1"], 2, ["train.momentum=-1.0"]),
        ("image-size-huge", [*base, "--data.image_size", "4096"], 2, ["data.image_size=4096"]),
        (
            "image-size-not-the-models",
            [*base, "--data.image_size", "48"],
            2,
            ["data.image_size=48", "32, the input size model.overrides.vision_cfg.image_size builds the model for"],
        ),
        (
            "image-size-below-a-patch",
            ["--config", str(d / "vit_small_input.yaml"), *QUIET, *out],
            2,
            ["data.image_size=8", "at least the model's patch size, 16"],
        ),
        (
            "min-clients-above-all",
            [*base, "--federation.min_clients", "4"],
            2,
            ["federation.min_clients=4", "at most 3, the clients a round samples"],
        ),
        (
            "min-clients-above-sampled",
            [*base, "--partition.num_clients", "10", "--federation.client_fraction", "0.2", "--federation.min_clients", "3"],
            2,
            ["federation.min_clients=3", "at most 2", "federation.client_fraction=0.2"],
        ),
        ("override-key", [*base, "--model.overrides", "{foo: 1}"], 2, ["model.overrides.foo"]),
        (
            "override-subkey",
            [*base, "--model.overrides", "{vision_cfg: {widht: 64}}"],
            2,
            ["model.overrides.vision_cfg.widht", "did you mean 'width'"],
        ),
        ("model-name", [*base, "--model.name", "NoSuchModel"], 2, ["model.name='NoSuchModel'"]),
        # resources
        ("devices-64", [*base, "--federation.devices", "64"], 2, ["federation.devices=64", "CPU core"]),
        ("loader-workers", [*base, "--data.num_workers", "1000"], 2, ["data.num_workers=1000", "CPU core"]),
        ("gpu-without-gpu", [*base, "--federation.accelerator", "gpu"], 2, ["federation.accelerator='gpu'", "no visible GPU"]),
        ("output-dir-file", ["--config", TINY, *QUIET, "--output_dir", str(d / "a_file")], 2, ["is a file, not a folder"]),
        (
            "output-dir-under-file",
            ["--config", TINY, *QUIET, "--output_dir", str(d / "a_file" / "runs")],
            2,
            ["cannot be created", "is a file"],
        ),
        ("output-dir-unwritable", ["--config", TINY, *QUIET, "--output_dir", "/proc/fl_lightning_runs"], 2, ["is not writable"]),
        ("checkpoint-missing", [*base, "--model.checkpoint", str(d / "none.pt")], 2, ["none.pt"]),
        ("checkpoint-text", [*base, "--model.checkpoint", str(d / "notes.txt")], 2, ["notes.txt"]),
        ("checkpoint-empty", [*base, "--model.checkpoint", str(d / "empty.pt")], 2, ["empty.pt"]),
        ("checkpoint-truncated", [*base, "--model.checkpoint", str(d / "truncated.pt")], 2, ["truncated.pt"]),
        ("dataset-missing", [*base, "--data.name", "cifar10", "--data.root", str(d / "nodata")], 2, ["cifar10", "data.root"]),
        # paths are contained
        ("run-name-dotdot", [*base, "--run_name", ".."], 2, ["run_name='..'"]),
        ("run-name-abs", [*base, "--run_name", "/tmp/elsewhere"], 2, ["run_name='/tmp/elsewhere'"]),
        ("run-name-nested", [*base, "--run_name", "a/b"], 2, ["run_name='a/b'"]),
        # variants: a bad later entry stops before the first one runs
        (
            "variant-late-bad",
            [*base, "--variants", "[{run_name: ok}, {run_name: bad, train: {momentum: -3}}]"],
            2,
            ["train.momentum=-3.0", "variants[1]"],
        ),
        (
            "variant-late-checkpoint",
            [*base, "--variants", f"[{{run_name: ok}}, {{run_name: bad, model: {{checkpoint: {d / 'notes.txt'}}}}}]"],
            2,
            ["notes.txt", "variants[1]"],
        ),
        # the run folder
        ("folder-in-use", [*base, "--run_name", "busy"], 2, ["is in use by another run", "pid"]),
        ("resume-corrupt-checkpoint", ["--resume", str(d / "runs" / "corrupt_run")], 2, ["server.pt", "cannot be read"]),
    ]


@pytest.fixture(scope="module")
def table(files):
    steps = [{"id": i, "argv": argv} for i, argv, _, _ in _cases(files)]
    steps.append({"id": "debug", "argv": ["--config", TINY, *QUIET, "--train.momentum", "-1", "--debug"]})
    start = time.monotonic()
    results = drive(steps)
    print(f"{len(steps)} hostile cases in {time.monotonic() - start:.1f} s")
    return results


_IDS = [c[0] for c in _cases(REPO)]


@pytest.mark.parametrize("case", _IDS)
def test_hostile_input_is_one_line(case, table, files):
    _, argv, rc, needles = next(c for c in _cases(files) if c[0] == case)
    line = assert_one_line(table[case], rc, *needles)
    assert "weights_only=False" not in line  # never advise turning the safety off


def test_nothing_was_written_by_the_failed_cases(table, files):
    """No case produced results, and only the two cases that fail after the folder is claimed (a model or
    data set found missing when it is built) left a folder: preflight failures leave nothing. A case that
    fails in training (lr-inf) has computed the frozen backbone's features first: they are kept, whole, in
    feature_cache/ for the next run of the comparison (not a result of any run)."""
    runs = files / "runs"
    assert sorted(p.name for p in runs.iterdir() if p.name != "feature_cache") == [
        "busy",
        "corrupt_run",
        "fedavg_cifar10_a0.5_s0",
        "fedavg_digits_a0.5_s0",
    ]
    assert all(p.suffix == ".pt" for p in (runs / "feature_cache").iterdir())  # no temporary file left
    assert not list(runs.glob("*/summary.json")) and not list(runs.glob("*/metrics.csv"))
    assert not list(runs.glob("*/.lock")) or list(runs.glob("*/.lock")) == [runs / "busy" / ".lock"]


@pytest.mark.parametrize("extra", [[], ["--print-config"]])
def test_an_alias_bomb_stops_within_2_s(extra, files, capsys):
    from fl_lightning.train import main

    start = time.monotonic()
    assert main(["--config", str(files / "bomb.yaml"), *extra]) == 2
    # ~0.1 s here (the aliases are counted before anything is built); unguarded it runs until killed. The
    # bound is 10x the 2 s asked for, so that a slow or loaded machine cannot fail it (tests/outcomes.py).
    assert time.monotonic() - start < 20.0
    assert "holds more than 100,000 values" in capsys.readouterr().err


def test_aliases_of_a_normal_size_still_work(tmp_path):
    from fl_lightning.config.loading import load_config

    path = tmp_path / "aliases.yaml"
    path.write_text(open(TINY).read() + "variants:\n  - &v {algorithm: afl, train: {lr: 0.5}}\n  - *v\n")
    assert load_config(path).variants == [{"algorithm": "afl", "train": {"lr": 0.5}}] * 2


def test_debug_shows_the_traceback(table):
    r = table["debug"]
    assert r["rc"] == 2 and "Traceback" in r["stderr"]
    assert r["stderr"].strip().splitlines()[-1].startswith("fl_lightning: config error: train.momentum")


@pytest.mark.parametrize(
    "overrides, gpus, cpus, memory, needle",
    [
        (["--federation.accelerator", "gpu", "--federation.devices", "4"], 2, 64, 2**40, "2 GPU(s) are visible"),
        (["--federation.devices", "4"], 2, 64, 2**40, "2 GPU(s) are visible"),  # auto picks the GPUs
        (["--federation.accelerator", "cuda"], 0, 64, 2**40, "no visible GPU"),
        (["--federation.devices", "3"], 0, 2, 2**40, "may use 2 CPU core(s)"),
        (["--federation.devices", "2"], 0, 2, 2**29, "GiB are available"),
        (["--federation.devices", "4", "--federation.accelerator", "cpu"], 8, 4, 2**40, None),  # CPU ranks on a GPU box
        (["--federation.devices", "2"], 2, 1, 2**20, None),  # GPU ranks: the CPU and memory floor do not apply
    ],
)
def test_devices_against_what_the_machine_has(overrides, gpus, cpus, memory, needle, monkeypatch):
    from fl_lightning.config.loading import load_config
    from fl_lightning.errors import ResourceError
    from fl_lightning.preflight import check_devices

    monkeypatch.delenv("FL_LIGHTNING_SKIP_RESOURCE_CHECK", raising=False)
    cfg = load_config(TINY, overrides)
    if needle is None:
        check_devices(cfg, gpus=gpus, cpus=cpus, memory=memory)
        return
    with pytest.raises(ResourceError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_devices(cfg, gpus=gpus, cpus=cpus, memory=memory)


# ----------------------------------------------------------------------------- a run folder's life


def test_a_run_folder_is_never_silently_changed(tmp_path):
    out = tmp_path / "runs"
    run = out / "fedavg_digits_a0.5_s0"
    base = ["--config", TINY, *QUIET, "--output_dir", str(out)]
    cfg_yaml = str(run / "config.yaml")
    steps = [
        {"id": "first", "argv": base},
        {"id": "mix", "argv": ["--resume", str(run), "--federation.rounds", "2", "--partition.alpha", "100", "--seed", "7"]},
        {"replace": cfg_yaml, "old": "alpha: 0.5", "new": "alpha: 100.0"},
        {"id": "edited", "argv": ["--resume", str(run), "--federation.rounds", "2"]},
        {"replace": cfg_yaml, "old": "alpha: 100.0", "new": "alpha: 0.5"},
        {"replace": cfg_yaml, "old": "algorithm: fedavg", "new": "algorithm: fedopal"},
        {"id": "algorithm-edited", "argv": ["--resume", str(run), "--federation.rounds", "2"]},
        {"replace": cfg_yaml, "old": "algorithm: fedopal", "new": "algorithm: fedavg"},
        {"id": "extend", "argv": ["--resume", str(run), "--federation.rounds", "2", "--logging.progress", "true"]},
        *[
            {"copy": str(run / name), "to": str(tmp_path / f"extended.{name}")}
            for name in ("run.json", "config.yaml", "summary.json")
        ],
        {"id": "fewer-rounds", "argv": ["--resume", str(run), "--federation.rounds", "1"]},
        {"id": "rerun-same", "argv": [*base, "--federation.rounds", "2"]},
        *[{"copy": str(run / name), "to": str(tmp_path / f"rerun.{name}")} for name in ("run.json", "summary.json")],
        {"id": "rerun-other", "argv": [*base, "--train.lr", "0.5"]},
        {"id": "overwrite", "argv": [*base, "--train.lr", "0.5", "--overwrite"]},
        {"id": "failed-start", "argv": [*base, "--run_name", "fs", "--model.name", "NoSuchModel"]},
        {"id": "retry", "argv": [*base, "--run_name", "fs", "--federation.rounds", "1"]},
    ]
    r = drive(steps)
    assert r["first"]["rc"] == 0, r["first"]["stderr"][-2000:]
    assert_one_line(r["mix"], 2, "--resume cannot change", "partition.alpha: 0.5 → 100.0", "seed: 0 → 7")
    line = assert_one_line(r["edited"], 2, "config.yaml was edited", "partition.alpha: 0.5 → 100.0")
    assert "run.json" in line
    line = assert_one_line(r["algorithm-edited"], 2, "config.yaml was edited", "algorithm: 'fedavg' → 'fedopal'")
    assert "federation.rounds" not in line.split("(")[1].split(")")[0]
    assert_one_line(r["fewer-rounds"], 2, "federation.rounds=1", "the 2 rounds this run has already completed")
    assert r["extend"]["rc"] == 0, r["extend"]["stderr"][-2000:]
    # the resume that extended the run is recorded; config.yaml and the summary agree with what ran
    record = json.loads((tmp_path / "extended.run.json").read_text())
    assert [s["resume"] for s in record["starts"]] == [False, True]
    assert record["config"]["federation"]["rounds"] == 2 and record["config"]["partition"]["alpha"] == 0.5
    assert yaml.safe_load((tmp_path / "extended.config.yaml").read_text())["federation"]["rounds"] == 2
    extended = json.loads((tmp_path / "extended.summary.json").read_text())
    assert extended["rounds"] == 2 and extended["alpha"] == 0.5 and extended["seed"] == 0
    # the same command again on a finished run: not run again, its results reported, the folder untouched
    assert r["rerun-same"]["rc"] == 0, r["rerun-same"]["stderr"][-2000:]
    assert_one_line(r["rerun-same"], 0, "1 of 1 run(s) finished already", "not run again")
    assert (tmp_path / "rerun.run.json").read_text() == (tmp_path / "extended.run.json").read_text()
    assert (tmp_path / "rerun.summary.json").read_text() == (tmp_path / "extended.summary.json").read_text()
    assert_one_line(r["rerun-other"], 2, "holds a different run", "train.lr: 0.1 → 0.5", "--overwrite")
    assert r["overwrite"]["rc"] == 0, r["overwrite"]["stderr"][-2000:]
    summary = json.loads((run / "summary.json").read_text())
    record = json.loads((run / "run.json").read_text())
    written = yaml.safe_load((run / "config.yaml").read_text())
    assert summary["rounds"] == 1 and summary["alpha"] == 0.5 and summary["seed"] == 0
    assert written["train"]["lr"] == 0.5 and record["config"]["train"]["lr"] == 0.5
    assert [s["resume"] for s in record["starts"]] == [False]  # --overwrite began a new record
    assert not (run / ".lock").exists()
    # a start that failed before any client finished leaves nothing to lose: the corrected one may go ahead
    assert_one_line(r["failed-start"], 2, "model.name='NoSuchModel'")
    assert r["retry"]["rc"] == 0, r["retry"]["stderr"][-2000:]
