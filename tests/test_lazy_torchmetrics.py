"""The deferred torchmetrics root: Lightning imports with the real ``Metric`` and without the metric domains;
any other name loads the real package, once, in the same module object."""

import subprocess
import sys

import pytest

from tests.conftest import REPO

_CODE = """
import sys
import fl_lightning
from fl_lightning import _lazy_torchmetrics
from lightning import LightningModule
import torchmetrics
assert _lazy_torchmetrics.is_deferred()
assert not {'transformers', 'scipy.signal', 'torchmetrics.functional'} & set(sys.modules), sorted(sys.modules)
import importlib.metadata
assert torchmetrics.__version__ == importlib.metadata.version('torchmetrics')
import torchmetrics.metric
assert torchmetrics.Metric is torchmetrics.metric.Metric
from torchmetrics import MetricCollection
accuracy = torchmetrics.Accuracy(task='multiclass', num_classes=3)  # a root-only name: the real __init__ runs
assert not _lazy_torchmetrics.is_deferred() and sys.modules['torchmetrics'] is torchmetrics
assert torchmetrics.functional.accuracy is not None and torchmetrics.Metric is torchmetrics.metric.Metric
try:
    torchmetrics.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError('a missing name must raise AttributeError')
print('ok')
"""


# a submodule before anything else (torchmetrics' internal import cycle must still resolve), then the root
_SUBMODULE_FIRST = """
import fl_lightning
from torchmetrics.classification import MulticlassAccuracy
import torchmetrics, torchmetrics.metric
assert issubclass(MulticlassAccuracy, torchmetrics.metric.Metric) and torchmetrics.Metric is torchmetrics.metric.Metric
assert torchmetrics.classification.MulticlassAccuracy is MulticlassAccuracy
assert torchmetrics.Accuracy is torchmetrics.classification.Accuracy  # the root, loaded on demand: one set of modules
assert torchmetrics.classification.MulticlassAccuracy is MulticlassAccuracy
print('ok')
"""


@pytest.mark.parametrize("code", [_CODE, _SUBMODULE_FIRST], ids=["lightning-first", "submodule-first"])
def test_lightning_imports_without_torchmetrics_domains_and_the_rest_loads_on_demand(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
