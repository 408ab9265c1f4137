"""The freezing both feature backbones share (:class:`~fl_lightning.models.vit_backbone.ViTBackbone`,
:class:`~fl_lightning.models.cnn_backbone.CNNBackbone`): a wrapped ``self.model`` that, once frozen,
takes no gradients and stays in eval mode (no dropout, BatchNorm on its running statistics) even when
a LightningModule around it switches to training."""

from __future__ import annotations

from typing import TypeVar

from torch import nn

__all__ = ["FrozenTrunk"]

_Self = TypeVar("_Self", bound="FrozenTrunk")


class FrozenTrunk(nn.Module):
    """A module around ``self.model`` (set by the subclass) that can be frozen for good."""

    model: nn.Module
    _frozen: bool = False

    def freeze(self: _Self) -> _Self:
        """Stop gradients to every parameter of ``model`` and keep it in eval mode from now on."""
        self._frozen = True
        self.model.requires_grad_(False)
        self.model.eval()
        return self

    @property
    def frozen(self) -> bool:
        return self._frozen

    def train(self: _Self, mode: bool = True) -> _Self:
        super().train(mode)
        if self._frozen:  # a frozen trunk stays in eval mode inside a module switched to training
            self.model.eval()
        return self
