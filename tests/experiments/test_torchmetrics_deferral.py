"""The deferred torchmetrics root (the CLI's opt-in fast start, never ``import fl_lightning``): a submodule
imported first still resolves torchmetrics' own import cycle, Lightning gets the real ``Metric``, and any root-only
name loads the real package once, in the same module object; and the installed torchmetrics is one of the releases
it is pinned to (that a timm run's imports leave the metric domains out is tested with the loop, in
tests/federation/test_simulation.py)."""

import subprocess
import sys

from tests.conftest import REPO

_CODE = """
import sys, importlib.metadata
import fl_lightning
from fl_lightning.experiments import torchmetrics_deferral as _lazy_torchmetrics
assert not _lazy_torchmetrics.is_deferred()  # importing the package defers nothing
assert _lazy_torchmetrics.install()
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


_PLOT_CODE = """
import sys, json, torch
import os
import fl_lightning
from fl_lightning.experiments import torchmetrics_deferral
if os.environ.get('DEFER') == '1':
    assert torchmetrics_deferral.install()
import lightning
from lightning import LightningModule
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy
before = 'matplotlib' in sys.modules
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
plt.rcParams['axes.facecolor'] = 'red'  # torchmetrics draws under plt.style.context(['default']): not red
m = MulticlassAccuracy(num_classes=3)
values = [m(torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 1])) for _ in range(3)]
fig, ax = m.plot(values)
mc = MetricCollection([MulticlassAccuracy(num_classes=3)])
mc.update(torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 1]))
try:
    mc.plot(ax='not an axes', together=True)
    bad_ax = 'accepted'
except ValueError:
    bad_ax = 'refused'
print(json.dumps({'matplotlib_at_import': before, 'facecolor': list(ax.get_facecolor()), 'xlabel': ax.get_xlabel(),
                  'ydata': [list(map(float, line.get_ydata())) for line in ax.get_lines()], 'bad_ax': bad_ax}))
"""


def test_matplotlib_waits_for_the_first_plot_which_draws_as_torchmetrics_does():
    """``import lightning`` through fl_lightning imports no matplotlib; the first ``metric.plot()`` then
    draws the same figure (style context, labels, values) as eager torchmetrics, and ``MetricCollection``
    still refuses an ``ax`` that is not a matplotlib axis."""
    import json
    import os

    out = {}
    for mode, env in (("deferred", {"DEFER": "1"}), ("eager", {})):
        proc = subprocess.run(
            [sys.executable, "-c", _PLOT_CODE], capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ, **env}
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["deferred"]["matplotlib_at_import"] is False and out["eager"]["matplotlib_at_import"] is True
    assert out["deferred"]["facecolor"] == [1.0, 1.0, 1.0, 1.0]
    assert out["deferred"]["bad_ax"] == "refused"
    assert {k: v for k, v in out["deferred"].items() if k != "matplotlib_at_import"} == {
        k: v for k, v in out["eager"].items() if k != "matplotlib_at_import"
    }


def test_the_installed_torchmetrics_is_a_pinned_release_and_others_are_imported_normally():
    import importlib.metadata

    from fl_lightning.experiments.torchmetrics_deferral import supported

    assert supported(importlib.metadata.version("torchmetrics")), (
        "torchmetrics is not a release the deferral was checked on: check it and add it to PINNED"
    )
    assert not supported("2.0.0") and not supported("1.4.0") and not supported("dev")
