"""Co-Boosting: one-shot FL through data and ensemble co-boosting (Dai et al., ICLR 2024) — DENSE plus
hard samples and a re-weighted ensemble.

Clients are DENSE's (``dense.py``): each trains its local timm CNN once (as the official
``fl_pretrain.py``: the CIFAR-style ResNet-18 ``cifar_resnet18`` from scratch, SGD lr 0.01, momentum 0.9,
batch 128, 100 local epochs, RandomCrop(32, 4) + flip, gradient norm clipped at 10 —
``coboosting.local_clip_grad``) and uploads it with its sample count. The server keeps per-client
ensemble weights w ∈ [0, 1]^K (w_0 = 1/K), A_w(x) = Σ_k w_k f_k(x) / Σ_k w_k, and for
``coboosting.epochs`` epochs (paper Alg. 1):

1. hard-sample synthesis (Eq. (5)-(6)): a re-drawn G and z trained for ``g_steps`` Adam steps on
       L_G = λ_oh·mean_i (1 − p_{y_i}(x_i))^γ·CE(A_w(x_i), y_i) + λ_bn·L_BN/K − λ_adv·mean_i KL_3(A_w(x_i) ‖ S(x_i)),
   p = softmax(A_w(x)), γ = ``hardness`` (the weight holds no gradient); G's gradient norm clipped at
   ``clip_grad``; the lowest-loss batch is kept with its labels y;
2. ensemble re-weighting (Eq. (8)-(9)), from the second epoch on, *before* that batch joins the pool
   (the official order: ``synthesize`` re-weights, then ``data_pool.add``): ``wa_steps`` passes over the
   pool so far, each batch read through the distillation's crop + flip and taking one signed step
   w ← clip_[0,1](w − μ·δ^epoch·sign(∇_w CE(A_w(x), y)));
3. the batch joins the pool; distillation on hardened samples (Eq. (7)): each pool batch, read through
   crop + flip (``pool_augment``: the official pool's ``transform`` is the training split's), is moved by
   one ODS step, x' = x + η·sign(∇_x Σ r ⊙ softmax(A_w(x)/4)), r ~ U(−1, 1), and S takes an SGD step on
   T²·KL_T(A_w(x') ‖ S(x')) (T = 4), gradient norm clipped, cosine learning-rate decay over the epochs.

S is a freshly drawn model (the official ``student = registry.get_model(args.student)``). Defaults are
the official code's (rong-dai/Co-Boosting ``co_boosting.sh`` / ``datafree_kd.py``: epochs 200, g_steps
30, lr_g 1e-3, batch 128, kd_lr 0.01, weight decay 1e-4, kd_T 4, adv 1, bn 0, oh 1, hs 1, odseta 8/255,
mu 0.01, wdc 0.99, wa_steps 1; the adversarial KL at T = 3 without DENSE's mask, no augmentation of
the generator's view, gradient clipping at 10 for G and S).

Reported accuracy: the final student's; the official code logs the best test accuracy over the epochs
(``best_acc1``), a selection on the test set.

Backbone, core keys not used, the departures shared with DENSE and the server on several ranks (the
re-weighted ensemble split over them as DENSE's mean is): see ``dense.py``. Also:
* Images are ImageNet-normalised (the official code normalises CIFAR with mean = std = 0.5).
* η = 8/255 is applied in the models' (normalised) input space, as the official code does (its pool
  images pass the dataset's normalising transform before the perturbation).
* The official code clips w − w_0 to [−1, 1] before clipping w to [0, 1]; the second implies the first.
* The final weights are reported in summary.json (``ensemble_weights``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.algorithms.dense import DENSE, DENSEConfig
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import register
from fl_lightning.federation.policies.privacy_coverage import gap_by

__all__ = ["CoBoosting", "CoBoostingConfig"]


@dataclass
class CoBoostingConfig(DENSEConfig):
    # DENSE's keys, with the official Co-Boosting defaults
    synthesis_batch_size: int = 128
    batch_size: int = 128
    kd_lr: float = 0.01
    kd_weight_decay: float = 1e-4  # official Co-Boosting's
    kd_schedule: Literal["constant", "cosine"] = "cosine"  # official Co-Boosting's
    temperature: float = 4.0
    bn: float = 0.0
    adv_temperature: float = 3.0
    adv_mask: bool = False
    synthesis_augment: bool = False
    clip_grad: float | None = 10.0
    local_clip_grad: float | None = 10.0  # fl_pretrain.py clips the clients' gradient norm at 10 too
    # what Co-Boosting adds
    hardness: float = 1.0  # γ of the hardness weight (1 − p_y)^γ (official --hs)
    ods_eta: float = 8 / 255  # η of the ODS step on distillation batches (official --odseta 8, /255)
    mu: float = 0.01  # step of the ensemble re-weighting
    wdc: float = 0.99  # δ: the step decays as μ·δ^epoch
    wa_steps: int = 1  # passes over the pool per re-weighting

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("hardness", "ods_eta", "mu"):
            check(getattr(self, key) >= 0, key, getattr(self, key), "a float >= 0")
        check(0 < self.wdc <= 1, "wdc", self.wdc, "a float in (0, 1]")
        check(self.wa_steps >= 0, "wa_steps", self.wa_steps, "an int >= 0")


@register("coboosting")
class CoBoosting(DENSE):
    config_class = CoBoostingConfig

    # federation.privacy: not covered, as DENSE.
    privacy_gap = gap_by(DENSE.privacy_gap)

    bn_per_model = True  # the official code divides L_BN by K

    def synthesis_settings(self):  # noqa: ANN201
        from dataclasses import replace

        return replace(super().synthesis_settings(), hardness=self.config.hardness)

    def ods_eta(self) -> float | None:
        return self.config.ods_eta or None

    def ensemble_weights(self, num_members: int) -> Tensor:
        return torch.full((num_members,), 1.0 / num_members)  # w_0 = 1/K

    def reweight(
        self, epoch: int, ensemble: nn.Module, pool: Tensor, labels: Tensor, view: Callable[[Tensor, torch.Generator], Tensor]
    ) -> None:
        """Eq. (8)-(9): signed-gradient steps on the ensemble weights against the pool's labels.

        As the official ``CoBoostingSynthesizer.synthesize``: after the epoch's synthesis and before its batch
        joins the pool (so the pool holds the earlier epochs' batches), each pool batch read through the
        distillation's augmentation ``view``."""
        from fl_lightning.modules.data_free_kd import combine_logits, reweight_ensemble

        c = self.config
        if epoch == 0 or c.mu == 0:  # the official code starts re-weighting at the second epoch
            return
        step = c.mu * c.wdc**epoch
        order_rng = torch.Generator().manual_seed(self.cfg.seed + epoch)
        w = ensemble.weights.detach().clone()
        for _ in range(c.wa_steps):
            order = torch.randperm(pool.shape[0], generator=order_rng)
            for start in range(0, pool.shape[0], c.batch_size):
                idx = order[start : start + c.batch_size]
                with torch.no_grad(), self.fabric.autocast():  # the run's precision; w's step in float32
                    member = ensemble.member_logits(view(pool[idx], order_rng)).float()  # (K, B, C)
                w = w.requires_grad_(True)
                loss = F.cross_entropy(combine_logits(member, w), labels[idx])
                (grad,) = torch.autograd.grad(loss, w)
                w = reweight_ensemble(w.detach(), grad, step=step)
        ensemble.weights = w.detach()
