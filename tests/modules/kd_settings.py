"""The data-free distillation tests' synthesis settings: a short CE-only synthesis unless the test turns terms on."""

from __future__ import annotations

from typing import Any

from fl_lightning.modules.data_free_kd import SynthesisSettings

CE_ONLY: dict[str, Any] = dict(
    steps=40,
    batch_size=40,
    lr=0.05,
    oh=1.0,
    bn=0.0,
    adv=0.0,
    adv_temperature=1.0,
    mask_agreement=True,
    hardness=None,
    bn_per_model=False,
    augment=False,
    clip_grad=None,
)


def synthesis_settings(**kw: Any) -> SynthesisSettings:
    """:data:`CE_ONLY` with ``kw`` replacing its entries."""
    return SynthesisSettings(**{**CE_ONLY, **kw})
