"""Importing the library changes no other package and no interpreter setting: the same fingerprint of the
process (import finders, garbage collector, torch's process-wide settings, warnings filters, torchmetrics'
own module) after importing every fl_lightning module as after importing only the libraries it builds on."""

import json
import subprocess
import sys

from tests.conftest import REPO

_FINGERPRINT = """
import gc, json, sys, warnings
import torch
fp = {
    'meta_path': [type(f).__module__ + '.' + type(f).__qualname__ for f in sys.meta_path],
    'path_hooks': len(sys.path_hooks),
    'gc': [gc.isenabled(), gc.get_freeze_count() > 0, list(gc.get_threshold())],
    'torch': [torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
              torch.get_num_threads(), torch.get_default_dtype() is torch.float32],
    'recursion': sys.getrecursionlimit(),
    'switch': sys.getswitchinterval(),
    'warnings': len(warnings.filters),
    'torchmetrics_patched': [n for n in vars(sys.modules['torchmetrics']) if n.startswith('_fl_lightning')],
}
print(json.dumps(fp))
"""

_LIBRARIES = "import torch, lightning, lightning.fabric, timm, torchmetrics, yaml, rich\n"

_EVERYTHING = """
import pkgutil, importlib
import fl_lightning
import lightning, torchmetrics
for info in pkgutil.walk_packages(fl_lightning.__path__, 'fl_lightning.'):
    if info.name == 'fl_lightning.experiments.torchmetrics_deferral':
        continue  # the CLI's opt-in (it does nothing on import anyway)
    importlib.import_module(info.name)
"""


def _fingerprint(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code + _FINGERPRINT], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_every_module_of_the_library_changes_no_other_package_and_no_interpreter_setting():
    assert _fingerprint(_EVERYTHING) == _fingerprint(_LIBRARIES)
