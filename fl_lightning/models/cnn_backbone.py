"""A frozen timm CNN as a feature extractor: its pooled pre-logit features h (B, feature_dim).

AFL's and FedCGS's official code (ZHUANGHP/Analytic-federated-learning, Yuqin-G/FedCGS) run on the
penultimate features of an ImageNet ResNet-18, FedPFT's paper also on a ResNet-50; FedOPAL's
comparison (§IV-A4) runs each baseline on "the backbone network specified in their paper". This
module gives those methods any timm model without a ViT layout (``model: {library: timm, name:
resnet18}``) with the feature interface they use on a ViT (:class:`~fl_lightning.models.vit_backbone.ViTBackbone`:
``forward(images) → h``, ``feature_dim``, ``library``, ``mean``/``std``, ``image_size``, ``freeze()``):

    h = model.forward_head(model.forward_features(images), pre_logits=True)   # timm's own seam

that is the global-average-pooled last stage (512-d for ResNet-18, 2048-d for ResNet-50), exactly
what ``torchvision.models.resnet18`` gives before ``fc``. No prompts can go into a CNN, so the
prompt methods (FedOPAL, FedAvg of prompts) refuse it.

Weights come as for the timm ViTs (:func:`~fl_lightning.models.timm_backbone.build_timm_model`):
a local ``model.checkpoint`` (timm's own ``resnet18.a1_in1k`` file, or torchvision's
``resnet18-f37072fd.pth``, whose keys are timm's too), checked first and loaded with the file's
classifier dropped and the remaining keys compared with the model's (one line if they do not fit);
a tag looked up in the local caches; or ``download: true``. ``pretrained: null`` and no checkpoint:
timm's random initialisation (tests, and a demonstration of the path — random features are no
evidence).
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn

from fl_lightning.models.frozen_trunk import FrozenTrunk
from fl_lightning.models.vit_backbone import IMAGENET_MEAN, IMAGENET_STD, normalization_name

__all__ = ["CNNBackbone"]

_DEFAULT_IMAGE_SIZE = 224  # the ImageNet resolution the weights were trained at (any size runs)


class CNNBackbone(FrozenTrunk):
    """A timm model's pooled pre-logit features (``forward_head(..., pre_logits=True)``), frozen on request.

    Args:
        model: a timm model built with ``num_classes=0`` (it has ``forward_features`` / ``forward_head``
            and ``num_features``).
        mean, std: the input normalisation its weights expect (timm's ``pretrained_cfg``).
        image_size: the default input side when ``data.image_size`` is not given.

    Example:
        >>> import timm
        >>> cnn = CNNBackbone(model=timm.create_model("resnet18", num_classes=0, layers=[1, 1, 1, 1]))
        >>> cnn(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 512])
    """

    library: ClassVar[str] = "timm"

    def __init__(
        self,
        *,
        model: nn.Module,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        image_size: int = _DEFAULT_IMAGE_SIZE,
    ) -> None:
        super().__init__()
        if not (hasattr(model, "forward_features") and hasattr(model, "forward_head")):
            raise TypeError(f"{type(model).__name__} has no forward_features/forward_head (not a timm model)")
        self.model = model
        self.feature = "pooled"
        self.feature_dim = int(model.num_features)
        self.mean, self.std = tuple(mean), tuple(std)
        self.normalization = normalization_name(self.mean)
        self.image_size = int(image_size)
        self._frozen = False

    @classmethod
    def build(cls, *, image_size: int | None, **weights: Any) -> CNNBackbone:
        """timm's ``name`` with ``num_classes=0`` and its weights (see the module docstring); ``weights``: the other
        keywords of :func:`~fl_lightning.models.timm_backbone.build_timm_model` (a CNN takes any input size, so
        ``image_size`` is only the default input side)."""
        from fl_lightning.models.timm_backbone import build_timm_model

        model = build_timm_model(**weights, image_size=None, vit=False)
        cfg: dict[str, Any] = dict(getattr(model, "pretrained_cfg", None) or {})
        input_size = cfg.get("input_size") or (3, _DEFAULT_IMAGE_SIZE, _DEFAULT_IMAGE_SIZE)
        return cls(
            model=model,
            mean=tuple(cfg.get("mean", IMAGENET_MEAN)),
            std=tuple(cfg.get("std", IMAGENET_STD)),
            image_size=int(image_size or input_size[-1]),
        )

    def forward(self, images: Tensor) -> Tensor:
        """h: (B, 3, H, W) → (B, feature_dim), the pooled last stage before the classifier."""
        m = self.model
        return m.forward_head(m.forward_features(images), pre_logits=True)
