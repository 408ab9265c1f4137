"""The names of the FeDiSyn family's global model in the State and on the wire, and the LoRA-wrapped ViT's backbone keys.

State keys: ``backbone.*`` (the timm ViT without its head, plain timm keys), ``head.*`` and ``lora.*``
(peft's adapters); a download or upload carries a subset of them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fl_lightning.modules.lora_classifier import LoRAClassifier

__all__ = ["LORA", "HEAD", "BACKBONE", "BITS_PER_PARAM", "strip", "with_prefix", "bits", "backbone_keys", "backbone_state"]

LORA, HEAD, BACKBONE = "lora.", "head.", "backbone."
BITS_PER_PARAM = 32  # float32 on the wire


def strip(prefix: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix``, with it removed from their keys."""
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def with_prefix(prefix: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies of ``tensors`` under ``prefix``."""
    return {prefix + k: v.detach().cpu().clone() for k, v in tensors.items()}


def bits(tensors: Mapping[str, torch.Tensor]) -> float:
    """Bits of ``tensors`` on the wire (float32)."""
    return float(sum(t.numel() for t in tensors.values()) * BITS_PER_PARAM)


def backbone_keys(module: LoRAClassifier) -> dict[str, str]:
    """Plain timm key → key in the LoRA-wrapped model, for every non-LoRA, non-head weight."""
    inner = module.model.base_model.model
    return {
        k.replace(".base_layer", ""): k
        for k in inner.state_dict()
        if ".lora_" not in k and not k.startswith(module.head_name + ".")
    }


def backbone_state(module: LoRAClassifier) -> dict[str, torch.Tensor]:
    """The wrapped model's backbone weights under their plain timm keys."""
    inner = module.model.base_model.model.state_dict()
    return {plain: inner[key] for plain, key in backbone_keys(module).items()}
