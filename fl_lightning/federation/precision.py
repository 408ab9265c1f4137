"""What ``federation.precision`` does to the modules a method trains and to its frozen trunks (docs/gpu.md).

* ``32-true`` (the reference), ``64-true``: modules as built; Fabric's forward context only (nothing here).
* ``bf16-mixed`` / ``16-mixed``: float32 master weights, forwards under autocast (``16-mixed`` with a fresh
  ``GradScaler`` per local loop, ``local_training.py``). On CUDA a frozen trunk — a module with no trainable
  parameter, that no optimiser steps — is held in the compute dtype (:func:`trunk_dtype`): cast once at set-up
  instead of at every autocast forward. Matmuls and convolutions see the same values (autocast rounds a float32
  weight to that dtype for each of them anyway); the other weights (LayerNorm's scale and shift, the position
  embedding, the CLS token) are rounded once, a small change of the numbers on CUDA. On the CPU nothing changes
  (bit-identical to the runs before this rule).
* ``bf16-true`` / ``16-true`` (:data:`HALF_TRUE`): Fabric's ``HalfPrecision``: the trained modules ARE in
  half precision (``convert_module``: ``module.to(dtype)``, as ``fabric.setup`` does) and so are the float inputs
  (``convert_input``); no float32 master copy. Only a method that declares it can run so
  (``Algorithm.true_precision``: None) accepts them; every other method names why not in its
  ``true_precision`` and :func:`check_precision` turns that into one line (a ConfigError, exit status 2).

The functions read the Fabric's precision plugin; none changes a process-wide setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fl_lightning.errors import ConfigError

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.config import RunConfig

__all__ = [
    "HALF_TRUE",
    "check_precision",
    "converts_modules",
    "convert_module",
    "convert_input",
    "trunk_dtype",
    "hold_trunk",
    "compute_dtype",
]

HALF_TRUE = ("bf16-true", "16-true")
_MIXED = {"bf16-mixed": torch.bfloat16, "bf16": torch.bfloat16, "16-mixed": torch.float16, "16": torch.float16}


def converts_modules(precision: str) -> bool:
    """Whether ``precision`` puts the trained modules themselves in half precision (``bf16-true``, ``16-true``)."""
    return precision in HALF_TRUE


def check_precision(cfg: RunConfig, algorithm: type) -> None:
    """Refuse a ``*-true`` half precision for a method that cannot run in it (its ``true_precision`` reason).

    Raises:
        ConfigError: one line naming ``federation.precision``, the value, and the method's reason.
    """
    precision = cfg.federation.precision
    reason = getattr(algorithm, "true_precision", None)
    if converts_modules(precision) and reason:
        raise ConfigError("federation.precision", precision, f"32-true, bf16-mixed or 16-mixed for {cfg.algorithm} ({reason})")


def convert_module(fabric: Fabric, module: nn.Module) -> nn.Module:
    """``module`` in the dtype of a ``*-true`` half precision (Fabric's ``convert_module``); as it is otherwise."""
    if converts_modules(_name(fabric)):
        return fabric.strategy.precision.convert_module(module)
    return module


def convert_input(fabric: Fabric, data: Any) -> Any:
    """The float tensors of ``data`` in a ``*-true`` half precision's dtype (integers stay); as it is otherwise."""
    if converts_modules(_name(fabric)):
        return fabric.strategy.precision.convert_input(data)
    return data


def _name(fabric: Fabric) -> str:
    """The precision string of ``fabric``'s plugin (``"32-true"`` for a plugin without one)."""
    return str(getattr(fabric.strategy.precision, "precision", "32-true"))


def trunk_dtype(precision: str, device: torch.device | str, module: nn.Module) -> torch.dtype | None:
    """The dtype a frozen trunk is held in under ``precision`` on ``device``, or None (keep it as it is).

    Only a mixed precision on CUDA, and only a module none of whose parameters is trainable (prompts, LoRA and
    heads are float32 master weights; a trunk with one inside is left alone). On the CPU: None (results there
    stay bit-identical to float32 weights under autocast).
    """
    dtype = _MIXED.get(precision)
    if dtype is None or torch.device(device).type != "cuda":
        return None
    if any(p.requires_grad for p in module.parameters()):
        return None
    return dtype


def compute_dtype(precision: str, device: torch.device | str) -> torch.dtype:
    """The dtype a frozen network's forward computes in under ``precision`` on ``device``: bfloat16 / float16 for
    the bf16 / 16 precisions (mixed or true) on CUDA, else float32 (the CPU always: results there stay
    bit-identical to float32). FeDiSyn's client VAE encoding uses it (``synthesis/latents.py``)."""
    if torch.device(device).type != "cuda":
        return torch.float32
    return _MIXED.get(precision) or {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision, torch.float32)


def hold_trunk(fabric: Fabric, module: nn.Module) -> nn.Module:
    """``module`` moved to ``fabric``'s device and, where :func:`trunk_dtype` says so, cast to the compute dtype."""
    module = fabric.to_device(module)
    dtype = trunk_dtype(_name(fabric), fabric.device, module)
    return module if dtype is None else module.to(dtype)
