"""A comparison spread over jobs: ``--list-runs``, ``--shard I/N`` and ``python -m fl_lightning.compare DIR``."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from fl_lightning import train
from fl_lightning.experiments import comparison
from fl_lightning.experiments.plan import select_shard
from tests.conftest import CONF, REPO

# AFL and FedCGS (training-free, a second each) × 3 seeds at one α: 6 runs
_ARGS = [
    "--config",
    str(CONF / "fedopal_table2_tiny.yaml"),
    "--variants",
    "[{algorithm: afl, label: AFL}, {algorithm: fedcgs, label: FedCGS, fedcgs: {shrinkage: 1.0e-6}}]",
    "--sweep",
    '{partition.alpha: [0.1], "seed,partition.seed": [[0, 0], [1, 1], [2, 2]]}',
]
_NAMES = [f"{m}_digits_a0.1_s{s}" for m in ("afl", "fedcgs") for s in range(3)]


@pytest.mark.parametrize("n_items, count", [(1, 1), (6, 1), (6, 2), (6, 4), (7, 3), (2, 5), (108, 16)])
def test_the_shares_are_disjoint_and_cover_every_run_in_order(n_items, count):
    items = list(range(n_items))
    shares = [select_shard(items, i, count) for i in range(count)]
    assert sorted(x for share in shares for x in share) == items  # every run once
    assert all(share == sorted(share) for share in shares)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced
    with pytest.raises(ValueError):
        select_shard(items, count, count)


def _table(path):
    with path.open() as f:
        return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in csv.DictReader(f)]


def _main(argv, capsys):
    rc = train.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_runs_prints_the_runs_in_a_fixed_order(tmp_path, capsys):
    rc, out, _ = _main([*_ARGS, "--output_dir", str(tmp_path), "--list-runs"], capsys)
    assert rc == 0
    lines = [line.split("\t") for line in out.strip().splitlines()]
    assert [(int(i), name, state) for i, name, state, _ in lines] == [(i, n, "not started") for i, n in enumerate(_NAMES)]
    shares = []
    for i in range(4):
        rc, out, _ = _main([*_ARGS, "--output_dir", str(tmp_path), "--list-runs", "--shard", f"{i}/4"], capsys)
        assert rc == 0
        shares.append([line.split("\t")[1] for line in out.strip().splitlines()])
    assert shares == [[_NAMES[j] for j in range(i, 6, 4)] for i in range(4)]
    assert not any(tmp_path.iterdir())  # listing writes nothing


@pytest.mark.parametrize("value", ["4/4", "-1/4", "a/b", "1", "0/0", "1/2/3", ""])
def test_a_bad_shard_is_one_line_and_exit_2(value, capsys):
    rc, _, err = _main([*_ARGS, "--shard", value], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--shard {value!r}" in err and "0 <= I < N" in err and "SLURM_ARRAY_TASK_ID" in err, err


def test_shard_twice_or_with_resume_is_one_line(tmp_path, capsys):
    for argv, needle in (
        ([*_ARGS, "--shard", "0/2", "--shard", "1/2"], "--shard given twice"),
        (["--resume", str(tmp_path), "--shard", "0/2"], "--shard and --resume together"),
    ):
        rc, _, err = _main(argv, capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_shards_run_at_once_and_the_table_builder_sees_them_all(tmp_path, capsys):
    ref, out, part = tmp_path / "ref", tmp_path / "sharded", tmp_path / "partial"
    rc, _, err = _main([*_ARGS, "--output_dir", str(ref)], capsys)
    assert rc == 0, err[-3000:]

    # two shares at once (as two GPUs or two jobs of an array would): no run twice, every run done
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fl_lightning.train", *_ARGS, "--output_dir", str(out), "--shard", f"{i}/2"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in results]
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "feature_cache") == sorted(_NAMES)
    assert (out / "comparison.yaml").is_file()

    assert comparison.main([str(out)]) == 0
    err = capsys.readouterr().err
    assert "not finished" not in err, err
    assert _table(out / "comparison.csv") == _table(ref / "comparison.csv")
    (out / "comparison.yaml").unlink()  # a folder from before comparison.yaml: read run by run
    (out / "comparison.csv").unlink()
    assert comparison.main([str(out)]) == 0
    assert _table(out / "comparison.csv") == _table(ref / "comparison.csv")

    # one share of three: the table of what is finished, the others named
    rc, _, err = _main([*_ARGS, "--output_dir", str(part), "--shard", "1/3"], capsys)
    assert rc == 0, err[-3000:]
    missing = [_NAMES[j] for j in (0, 2, 3, 5)]
    assert f"the table holds 2 of 6 runs; not finished yet: {', '.join(missing)}" in err, err
    assert comparison.main([str(part)]) == 0
    assert f"not finished yet: {', '.join(missing)}" in capsys.readouterr().err
    assert f"Not finished yet (4 run(s), not in the table): {', '.join(missing)}." in (part / "comparison.md").read_text()
    rows = _table(part / "comparison.csv")
    assert [(r["method"], r["runs"]) for r in rows] == [("AFL", "1"), ("FedCGS", "1")]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["{tmp}"], "no run folder with a summary.json"),
        (["{tmp}/nowhere"], "'{tmp}/nowhere' is not a folder"),
        ([], "the following arguments are required: DIR"),
        (["{tmp}", "{tmp}"], "unrecognized arguments: {tmp}"),
        (["{tmp}", "--bogus"], "unrecognized arguments: --bogus"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--he"], "unrecognized arguments: --he"),
    ],
)  # no abbreviated --help
def test_a_bad_command_line_or_a_folder_without_finished_runs_is_one_line(argv, needle, tmp_path, capsys):
    assert comparison.main([a.format(tmp=tmp_path) for a in argv]) == 2
    out = capsys.readouterr()
    assert len(out.err.strip().splitlines()) == 1 and needle.format(tmp=tmp_path) in out.err, out.err
    assert out.err.startswith("fl_lightning: usage error: ") and out.out == ""


def test_help_names_the_argument_and_gives_an_example(capsys):
    assert comparison.main(["--help"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: python -m fl_lightning.compare [-h] DIR") and out.err == ""
    assert "a comparison's output_dir" in out.out and "comparison.{csv,md,png}" in out.out
    assert "example:\n  python -m fl_lightning.compare runs/fedopal_table2_cifar10\n" in out.out


@pytest.mark.parametrize("command", [["fl_lightning.compare"], ["fl_lightning.paired", "DIR", "A"]])
def test_the_real_commands_help_and_refuse_an_unknown_flag_in_one_line(command):
    """``python -m fl_lightning.compare`` / ``paired`` as a user runs them (the sys.exit(main()) wiring)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(*argv):
        return subprocess.run(
            [sys.executable, "-m", command[0], *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )

    helped = run("--help")
    assert helped.returncode == 0 and helped.stderr == "" and "example:" in helped.stdout, helped
    refused = run(*command[1:], "B", "--bogus")
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr.splitlines() == ["fl_lightning: usage error: unrecognized arguments: --bogus (see --help)"]


def test_jobs_runs_the_shares_as_local_processes_and_builds_the_table(tmp_path, capsys):
    ref, out = tmp_path / "ref", tmp_path / "jobs"
    rc, _, err = _main([*_ARGS, "--output_dir", str(ref)], capsys)
    assert rc == 0, err[-3000:]
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lightning.train", *_ARGS, "--output_dir", str(out), "--jobs", "2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _table(out / "comparison.csv") == _table(ref / "comparison.csv")
    # each share's lines whole and named by their share; the table built once, at the end, with every run in it
    shares = [line for line in proc.stdout.splitlines() if not line.startswith("comparison: ")]
    assert shares and all(line.startswith(("[0/2] ", "[1/2] ")) for line in shares), shares[:5]
    assert proc.stdout.count("comparison: ") == 1 and "not finished yet" not in proc.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "feature_cache") == sorted(_NAMES)
    for argv, needle in (
        ([*_ARGS, "--jobs", "0"], "--jobs '0'"),
        ([*_ARGS, "--jobs", "2", "--shard", "0/2"], "--jobs with --shard"),
    ):
        rc, _, err = _main(argv, capsys)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
