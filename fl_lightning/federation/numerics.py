"""The torch settings a run's config asks for (``federation.matmul_precision``, ``federation.deterministic``), applied
for the run and restored after it: a key of the config holds whoever runs it — the CLI, a comparison, a notebook's
``Simulation(cfg).run()``. Importing this module changes nothing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fl_lightning.config import FederationConfig

__all__ = ["torch_numerics", "uses_cuda"]


def uses_cuda(accelerator: str) -> bool:
    """Whether ``federation.accelerator`` runs on CUDA: ``cuda``, or ``gpu``/``auto`` with CUDA available (``gpu``
    on a Mac is MPS)."""
    import torch

    return accelerator == "cuda" or (accelerator in ("gpu", "auto") and torch.cuda.is_available())


@contextlib.contextmanager
def torch_numerics(federation: FederationConfig) -> Iterator[None]:
    """The run's process-wide torch settings, set for the run and restored afterwards, so that each run of a
    comparison has its own and a notebook's ``Simulation(cfg).run()`` (or an in-process ``main()``) leaves the process
    as it found it. :meth:`Simulation.run` applies them; the CLI applies them earlier too, around the simulation's
    construction (CUDA reads ``CUBLAS_WORKSPACE_CONFIG`` when it starts), and the inner call then changes nothing.

    * ``federation.matmul_precision``: ``torch.set_float32_matmul_precision`` on CUDA only (TF32 at "high", the
      default), and cuDNN's TF32 for float32 convolutions with it (``torch.backends.cudnn.allow_tf32``: on unless
      "highest"); on the CPU nothing changes.
    * ``federation.deterministic``: ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic
      kernel raises) and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` when unset (cuBLAS needs it for deterministic
      matmuls; read when CUDA starts, so set before the run builds anything).

    Every rank applies them: each runs the simulation (``ddp_spawn``'s processes included).
    """
    import torch

    matmul, conv_tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    set_workspace = federation.deterministic and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    try:
        if uses_cuda(federation.accelerator):
            torch.set_float32_matmul_precision(federation.matmul_precision)
            torch.backends.cudnn.allow_tf32 = federation.matmul_precision != "highest"
        if set_workspace:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        if federation.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)
        yield
    finally:
        if torch.get_float32_matmul_precision() != matmul:
            torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = conv_tf32
        if federation.deterministic:
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if set_workspace:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
