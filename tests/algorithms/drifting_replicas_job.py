"""The CLI with DENSE's replicas on rank 1 made to drift, for tests/algorithms/test_dense.py.

``python tests/algorithms/drifting_replicas_job.py CLI_ARGS...`` runs ``fl_lightning.train.main(CLI_ARGS)`` as a user's
``python -m fl_lightning.train`` would (Fabric's launcher starts rank 1 by running this same command again), with
rank 1 behaving as a GPU rank whose kernels are not deterministic may: its first synthesis keeps no batch where
rank 0's keeps one (a per-rank branch), its later batches differ at round-off, and its student drifts after every
distillation epoch.
"""

from __future__ import annotations

import os
import sys

import fl_lightning.modules.data_free_kd as kd
from fl_lightning.train import main

RANK = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))

if RANK == 1:
    _synthesize, _distill_epoch, _calls = kd.synthesize, kd.distill_epoch, []

    def synthesize(*args, **kwargs):
        images, labels = _synthesize(*args, **kwargs)
        _calls.append(1)
        if len(_calls) == 1 or images is None:
            return None, labels
        return images + 1e-3, labels

    def distill_epoch(student, *args, **kwargs):
        out = _distill_epoch(student, *args, **kwargs)
        for p in student.parameters():
            p.data.add_(1e-3)
        return out

    kd.synthesize, kd.distill_epoch = synthesize, distill_epoch

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
