"""FeDiSyn's client model: a pre-trained ViT with LoRA in every block, trained only in the last x_i.

One :class:`LoRAClassifier` is built per rank and reused for every client that rank simulates: per
client the algorithm loads the global LoRA and head state (:meth:`LoRAClassifier.load_lora_state`,
:meth:`LoRAClassifier.load_head_state`), sets the client's depth (:meth:`LoRAClassifier.set_depth`),
builds a fresh optimizer (:meth:`LoRAClassifier.configure_optimizers`) and trains. The backbone is
never re-wrapped (see ``fl_lightning.models.lora`` for why adapters live in all blocks).

What trains: the LoRA adapters of the last ``depth`` blocks AND the classification head. The head is
always trainable, since the pre-trained head knows only the synthetic classes' decision boundaries
and must adapt to the clients' real images; the algorithm decides whether the head is aggregated.
The backbone's own weights stay frozen.
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning
import torch
import torch.nn.functional as F
from torch import nn

from fl_lightning.models.lora import (
    LoraSpec,
    apply_lora,
    get_lora_state,
    last_blocks,
    lora_layer_indices,
    set_lora_state,
    set_trainable_depth,
)

__all__ = ["LoRAClassifier"]


class LoRAClassifier(lightning.LightningModule):
    """A classifier backbone with LoRA in all blocks, of which the last ``depth`` train.

    Args:
        backbone: a classifier (e.g. a timm ViT from ``load_pretrained_vit``); wrapped in place.
        spec: LoRA rank, alpha, dropout and target modules.
        lr: AdamW learning rate.
        weight_decay: AdamW decoupled weight decay.
        head_name: dotted name of the classification head inside ``backbone`` (``head`` for timm).
        layers_pattern: block container name (``blocks`` for timm, ``resblocks`` for open_clip).

    Example::

        module = LoRAClassifier(backbone=load_pretrained_vit(ckpt), spec=LoraSpec(rank=8))
        module.load_lora_state(global_lora); module.set_depth(4)
        optimizer = module.configure_optimizers()
    """

    def __init__(
        self,
        *,
        backbone: nn.Module,
        spec: LoraSpec = LoraSpec(),
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        head_name: str = "head",
        layers_pattern: str = "blocks",
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        try:
            backbone.get_submodule(head_name)
        except AttributeError:
            raise ValueError(f"head_name {head_name!r} is not a module of the backbone (its classification head)") from None
        self.lr, self.weight_decay, self.head_name = float(lr), float(weight_decay), head_name
        self.model = apply_lora(backbone, spec=spec, layers=None, layers_pattern=layers_pattern)
        blocks = lora_layer_indices(self.model)
        if not blocks:
            raise ValueError(f"target_modules {list(spec.target_modules)} match no module in the backbone's blocks")
        self.num_blocks = blocks[-1] + 1
        self.head.requires_grad_(True)
        self.depth = self.num_blocks  # all adapters train until set_depth says otherwise
        set_trainable_depth(self.model, self.num_blocks, num_blocks=self.num_blocks)

    @property
    def head(self) -> nn.Module:
        """The classification head (a module of the wrapped backbone)."""
        return self.model.base_model.model.get_submodule(self.head_name)

    @property
    def trained_blocks(self) -> list[int]:
        """Block indices whose LoRA trains at the current depth."""
        return last_blocks(self.depth, self.num_blocks)

    def set_depth(self, depth: int) -> list[int]:
        """Train the LoRA of the last ``depth`` blocks (the paper's x_i) from now on; returns their indices.

        Build the optimizer AFTER this call: it only holds parameters trainable at that moment.
        """
        trained = set_trainable_depth(self.model, depth, num_blocks=self.num_blocks)
        self.depth = depth
        return trained

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)  # (B, num_classes)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=self.lr, weight_decay=self.weight_decay)

    def lora_state(self, *, trained_only: bool = False) -> dict[str, torch.Tensor]:
        """LoRA adapters in the wire format; ``trained_only`` keeps the blocks of the current depth (the upload)."""
        return get_lora_state(self.model, layers=self.trained_blocks if trained_only else None)

    def load_lora_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load (possibly partial) wire-format LoRA state; blocks not in ``state`` keep their values."""
        set_lora_state(self.model, state)

    def head_state(self) -> dict[str, torch.Tensor]:
        """The head's parameters, keyed by their path in the backbone (``head.weight``, ``head.bias``)."""
        return {f"{self.head_name}.{k}": v.detach().clone() for k, v in self.head.state_dict().items()}

    def load_head_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load a state produced by :meth:`head_state` (all keys required)."""
        prefix = f"{self.head_name}."
        foreign = [k for k in state if not k.startswith(prefix)]
        if foreign:
            raise ValueError(f"head state key {foreign[0]!r} does not start with {prefix!r}")
        self.head.load_state_dict({k[len(prefix) :]: v for k, v in state.items()})
