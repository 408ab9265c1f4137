"""The deferred torchmetrics root: a submodule imported first still resolves torchmetrics' own import cycle,
Lightning gets the real ``Metric``, and any root-only name loads the real package once, in the same module
object (that a timm run's imports leave the metric domains out is tested with the loop, in
tests/federation/test_simulation.py)."""

import subprocess
import sys

from tests.conftest import REPO

_CODE = """
import sys, importlib.metadata
import fl_lightning
from fl_lightning import _lazy_torchmetrics
from torchmetrics.classification import MulticlassAccuracy  # a submodule before anything else
from lightning import LightningModule
import torchmetrics, torchmetrics.metric
assert _lazy_torchmetrics.is_deferred()
assert torchmetrics.__version__ == importlib.metadata.version('torchmetrics')
assert torchmetrics.Metric is torchmetrics.metric.Metric and issubclass(MulticlassAccuracy, torchmetrics.Metric)
torchmetrics.Accuracy(task='multiclass', num_classes=3)  # a root-only name: the real __init__ runs, once
assert not _lazy_torchmetrics.is_deferred() and sys.modules['torchmetrics'] is torchmetrics
assert torchmetrics.Accuracy is torchmetrics.classification.Accuracy  # one set of modules, nothing loaded twice
assert torchmetrics.classification.MulticlassAccuracy is MulticlassAccuracy
assert torchmetrics.Metric is torchmetrics.metric.Metric and torchmetrics.functional.accuracy is not None
try:
    torchmetrics.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError('a missing name must raise AttributeError')
print('ok')
"""


def test_a_submodule_lightning_and_the_root_on_demand_all_get_the_real_torchmetrics():
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
