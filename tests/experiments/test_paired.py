"""Paired differences of a comparison (fl_lightning/experiments/paired.py): pairs by cell, worst and mean by hand."""

from types import SimpleNamespace

import pytest

from fl_lightning.experiments.paired import main, paired_differences, paired_markdown


def _run(label, alpha, seed, acc):
    cfg = SimpleNamespace(label=label, algorithm=label.lower(), partition=SimpleNamespace(alpha=alpha, seed=seed), seed=seed)
    return cfg, {"accuracy": acc}


def test_pairs_are_matched_by_cell_and_tabulated():
    results = [
        _run("A", 0.1, 0, 0.90),
        _run("A", 0.1, 1, 0.80),
        _run("A", float("inf"), 0, 0.70),
        _run("B", 0.1, 1, 0.85),
        _run("B", 0.1, 0, 0.88),
        _run("B", float("inf"), 0, 0.71),
        _run("B", 1.0, 0, 0.5),
    ]  # no A on that cell: not a pair
    rows = paired_differences(results, method="B", reference="A")
    assert [(r["alpha"], r["seed"]) for r in rows] == [(0.1, 0), (0.1, 1), (float("inf"), 0)]
    assert [r["difference"] for r in rows] == pytest.approx([-0.02, 0.05, 0.01])
    text = paired_markdown(rows, method="B", reference="A")
    assert "| 0, 0 | -2.00 | +1.00 |" in text and "| 1, 1 | +5.00 | — |" in text
    assert "| **worst** | -2.00 | +1.00 |" in text and "| **mean** | +1.50 | +1.00 |" in text
    assert "worst -2.00, mean +1.33, 1 below 0" in text


def test_two_runs_of_a_label_on_one_cell_are_an_error():
    with pytest.raises(ValueError):
        paired_differences([_run("A", 0.1, 0, 0.9), _run("A", 0.1, 0, 0.8)], method="A", reference="B")


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "the following arguments are required: DIR, METHOD, REFERENCE"),
        (["x"], "the following arguments are required: METHOD, REFERENCE"),
        (["{tmp}", "A", "B", "C"], "unrecognized arguments: C"),
        (["{tmp}", "A", "B", "--bogus"], "unrecognized arguments: --bogus"),
        (["--bogus", "{tmp}", "A"], "unrecognized arguments: --bogus; the following arguments are required: REFERENCE"),
        (["{tmp}/missing_dir", "A", "B"], "'{tmp}/missing_dir' is not a folder"),
        (["{tmp}", "A", "B"], "'{tmp}' holds no comparison.yaml"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    out = capsys.readouterr()
    assert len(out.err.strip().splitlines()) == 1 and needle.format(tmp=tmp_path) in out.err, out.err
    assert out.err.startswith("fl_lightning: usage error: ") and out.out == ""


def test_help_names_the_arguments_and_gives_an_example(capsys):
    assert main(["-h"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: python -m fl_lightning.paired [-h] DIR METHOD REFERENCE") and out.err == ""
    assert "METHOD − REFERENCE in accuracy points" in out.out and "as in comparison.md" in out.out
    assert "example:\n  python -m fl_lightning.paired runs/fedopal_plus_vs_afl_dinov2_digits FedOPAL+ AFL\n" in out.out
