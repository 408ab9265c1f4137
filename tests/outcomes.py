"""Learning-outcome checks: thresholds that hold on any CPU, and the record that shows how far inside.

A test that asserts an accuracy, a margin or a loss after training is marked ``@pytest.mark.outcome``
and asserts through :func:`expect`. Such a number depends on floating-point order — which kernels
torch picks (``ATEN_CPU_CAPABILITY``: AVX-512, AVX2 or none), the number of threads — and on the seed,
so each threshold is set well inside the spread measured over seeds and kernel/thread combinations by
``python scripts/outcome_matrix.py`` (which reruns ``pytest -m outcome`` in that matrix and prints, per
check, the smallest value seen against its bound). Two environment variables serve that script:

* ``FL_TEST_SEED`` (default 0) shifts every seed an outcome test draws through :func:`outcome_seed`, so the same
  test runs on other data, partitions and initialisations;
* ``FL_OUTCOME_LOG``, a file path: :func:`expect` appends each checked value to it as one JSON line.

By default (neither set) the tests are the fixed-seed checks CI runs.
"""

from __future__ import annotations

import json
import operator
import os

import torch

__all__ = ["expect", "outcome_seed"]

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def outcome_seed(base: int = 0) -> int:
    """The seed an outcome test uses for its data, model or run: ``base`` at ``FL_TEST_SEED`` 0, and
    ``base + 1000·k`` at ``FL_TEST_SEED`` k, so that the seeds one test draws stay distinct across k."""
    return base + 1000 * int(os.environ.get("FL_TEST_SEED", "0"))


def expect(name: str, value: float, op: str, bound: float) -> None:
    """Assert ``value op bound`` and, when ``FL_OUTCOME_LOG`` is set, record the value beside its bound.

    Args:
        name: what the value is, unique within the test (e.g. ``"student - mean client"``).
        value: the measured outcome.
        op: one of ``>``, ``>=``, ``<``, ``<=``.
        bound: the threshold.
    """
    value, bound = float(value), float(bound)
    log = os.environ.get("FL_OUTCOME_LOG")
    if log:
        record = {
            "test": os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0],
            "check": name,
            "value": value,
            "op": op,
            "bound": bound,
            "seed": int(os.environ.get("FL_TEST_SEED", "0")),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        }
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
    assert _OPS[op](value, bound), f"{name}: {value:.4f} is not {op} {bound:.4f}"
