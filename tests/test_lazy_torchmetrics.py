"""The deferred torchmetrics root: Lightning imports with the real ``Metric`` and without the metric domains;
any other name loads the real package, once, in the same module object."""

import subprocess
import sys

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


def test_lightning_imports_without_torchmetrics_domains_and_the_rest_loads_on_demand():
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
