"""DENSE: data-free one-shot federated learning (Zhang et al., NeurIPS 2022).

One round. Each client trains its local model once — the FedAvg (ResNet) client of ``fedavg_cnn.py``,
a timm CNN, for ``train.epochs`` epochs with cross-entropy, on CIFAR's pad + crop + flip view of its
images (``dense.augment``) — and uploads its whole state dict and its sample count. The server never
sees data. It holds the ensemble A(x) = (1/K) Σ_k f_k(x) and, for ``dense.epochs`` epochs (paper Alg. 1):

1. data generation (Eq. (3)-(5)): re-draws a generator G and inputs z and trains both for ``g_steps``
   Adam steps (lr ``lr_g``, betas (0.5, 0.999)) on
       L_G = λ_oh·CE(A(x̃), y) + λ_bn·Σ_l (‖μ_l(x̃) − μ̂_l‖₂ + ‖σ²_l(x̃) − σ̂²_l‖₂) − λ_adv·mean_i m_i·KL(A(x̃_i) ‖ S(x̃_i)),
   x̃ a randomly shifted (black padding) and flipped view of x = normalise(G(z)), y uniform labels, the BN
   statistics over every BatchNorm layer of every client model, m_i = 1[S and A disagree on x̃_i]; the
   batch of lowest L_G joins the synthetic pool;
2. model distillation (Eq. (6)): one pass of SGD over the whole pool, each batch read through CIFAR's
   crop + flip (``dense.pool_augment``; the official ``synthesizer.get_data`` transform), on
   T²·KL_T(A(x) ‖ S(x)).

The global model S is the returned state: the clients' architecture, freshly drawn (``student_init:
fresh``, as the official ``global_model = get_model(args)`` before distillation). Defaults are the
official code's (zj-jayzhang/DENSE README: ``--g_steps 30 --lr_g 1e-3 --bn 1 --oh 1 --adv 1 --T 20
--lr 0.005 --epochs 200 --synthesis_batch_size 256 --batch_size 256``, nz 256, ngf 64, SGD momentum
0.9; the adversarial KL at T = 1).

Backbone, as the official code trains it (``loop_df_fl.py``, ``models/resnet.py``, ``helpers/datasets.py``):
``model.name: cifar_resnet18`` — the CIFAR-style ResNet-18 (3×3 stride-1 stem, no max-pool; 11.17 M
parameters at 10 classes; :mod:`fl_lightning.models.cifar_resnet`) from scratch, local SGD lr 0.01,
momentum 0.9, batch 128 (``local_bs``), no weight decay, 100 local epochs (``--local_ep``'s default; the
README's example runs 400), RandomCrop(32, padding=4) + RandomHorizontalFlip: the ``train:`` section of
``conf/fedopal_table2_*.yaml`` and ``conf/fedopal_kd_baselines_digits.yaml``. Any timm CNN works
(``model.name: resnet18`` with an ImageNet ``model.checkpoint``: FedOPAL's own ResNet-18 reading).
Core keys not used: ``model.pretrained``, ``model.feature``, ``federation.rounds`` (one round).

Reported accuracy: the final student's. The official code keeps the best test accuracy over the
server epochs (``bst_acc``), i.e. selects on the test set; we do not.

Departures, and why:
* The clients' common initial model is agreed through ``seed`` (or the checkpoint file), not downloaded
  (as FedOPAL's P_init): bytes_down is 0. (The official clients all start from one ``deepcopy`` too.)
* Images are ImageNet-normalised for the classifiers (the official DENSE feeds [0, 1] images without
  normalisation); the crops pad with black in pixel space either way (normalize(0) after normalising).
* The crop pads by S/8 (4 px at 32 px, 1 px at 8 px) at every resolution; for non-CIFAR datasets the
  official pool transform is a flip only, ours crop + flip everywhere.
* The fresh student is drawn under ``seed + 1000003`` (the official code draws it from the global RNG
  after the clients' training).
* The synthetic pool is kept in memory (the official code writes PNGs and reads them back, quantising to
  8 bits); ``dense.pool: last`` distils on the newest batch only (cheaper; not the paper's).
* DENSE also computes an unused second "local" view (random resized crop) of G's images, which we skip.
* The server also reports each client model's and the ensemble's test accuracy (``client_accuracy``,
  ``ensemble_accuracy``), as the official code prints them: they are evaluation, not training input.
* Each client's upload carries its local training time (``train_s``, 8 bytes) so that summary.json
  can report it; the server's synthesis + distillation time is reported too.
* A synthesis in which no generator step had a finite loss (NaN everywhere: e.g. bf16 logits of untrained
  clients) keeps no batch: that epoch adds nothing to the pool (one warning; distillation goes on on the pool so
  far, and is skipped while it is empty), and summary.json counts such epochs (``skipped_syntheses``). A run in
  which every synthesis was skipped stops with one error line: its student would be the untrained one.

On N > 1 ranks every rank runs the server together (``shared_aggregate``; not with ``federation.privacy``, whose
server steps run on rank 0): rank r holds client models [r·K/N, (r+1)·K/N) and the ensemble is
:class:`~fl_lightning.modules.data_free_kd_ranks.SplitEnsemble`, whose logits, BN terms and input gradients are
gathered in client order; G, z, S and every random draw are replicated (each rank runs the same seeded steps on
the same gathered values), so the student is one rank's bit for bit. Each rank evaluates its own client models
(the accuracies gathered in client order); the ensemble's accuracy is the split ensemble on the whole test split.
docs/ranks.md says what crosses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from fl_lightning.algorithms.common import evaluate_on_test, splits_work
from fl_lightning.algorithms.fedavg_cnn import FedAvgCNN, build_timm_classifier
from fl_lightning.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from fl_lightning.dealing import Deal
from fl_lightning.errors import check
from fl_lightning.federation.algorithm import Client, RoundHistory, RoundPlan, State, register
from fl_lightning.federation.policies.privacy_coverage import never_covered
from fl_lightning.federation.ranks.collectives import gathered
from fl_lightning.federation.transport import Download, Upload

__all__ = ["ClipGradNorm", "DENSE", "DENSEConfig"]

_STAT = "kd."  # server-side numbers kept in the state for summary.json; never part of the model
_STUDENT_SEED_OFFSET = 1_000_003  # a fresh student is drawn under seed + this: never the clients' initial model
_log = logging.getLogger(__name__)


class ClipGradNorm:
    """A local-training callback: clip the gradient norm of the module's parameters after each backward."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_after_backward(self, *, module: nn.Module) -> None:
        torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm=self.max_norm)


@dataclass
class DENSEConfig:
    epochs: int = 200  # server epochs: one synthesis + one distillation pass each
    g_steps: int = 30  # Adam steps on G and z per synthesis
    lr_g: float = 1e-3  # Adam step of the generator
    nz: int = 256  # latent size
    ngf: int = 64  # generator width
    synthesis_batch_size: int = 256  # synthetic images added to the pool per epoch
    batch_size: int = 256  # distillation batch
    kd_lr: float = 0.005  # student SGD
    kd_momentum: float = 0.9  # SGD momentum of the student's distillation
    kd_weight_decay: float = 0.0  # weight decay of the student's distillation
    kd_schedule: Literal["constant", "cosine"] = "constant"  # the student's learning-rate schedule over the server epochs
    temperature: float = 20.0  # T of the distillation KL (README's --T 20)
    oh: float = 1.0  # λ_oh
    bn: float = 1.0  # λ_bn
    adv: float = 1.0  # λ_adv
    adv_temperature: float = 1.0  # T of the adversarial KL
    adv_mask: bool = True  # only samples on which student and ensemble disagree push G
    synthesis_augment: bool = True  # the teacher sees a shifted and flipped view of G's images
    clip_grad: float | None = None  # max gradient norm of G and of the student (None: no clipping)
    pool: Literal["history", "last"] = "history"  # distil on every batch made so far, or the newest only
    pool_augment: bool = True  # the pool is read through CIFAR's crop + flip for distillation (both official codes)
    student_init: Literal["fresh", "clients"] = "fresh"  # official: a freshly drawn model; or the clients' start
    augment: bool = True  # CIFAR's pad + crop + flip in the clients' local training (both official codes)
    local_clip_grad: float | None = None  # max gradient norm in local training (Co-Boosting's code: 10)

    def __post_init__(self) -> None:
        for key in ("epochs", "g_steps", "nz", "ngf", "synthesis_batch_size", "batch_size"):
            check(getattr(self, key) >= 1, key, getattr(self, key), "an int >= 1")
        for key in ("lr_g", "kd_lr", "temperature", "adv_temperature"):
            check(getattr(self, key) > 0, key, getattr(self, key), "a float > 0")
        for key in ("oh", "bn", "adv", "kd_weight_decay"):
            check(getattr(self, key) >= 0, key, getattr(self, key), "a float >= 0")
        check(0 <= self.kd_momentum < 1, "kd_momentum", self.kd_momentum, "a float in [0, 1)")
        check(self.clip_grad is None or self.clip_grad > 0, "clip_grad", self.clip_grad, "a float > 0 or null")
        check(
            self.local_clip_grad is None or self.local_clip_grad > 0,
            "local_clip_grad",
            self.local_clip_grad,
            "a float > 0 or null",
        )


@register("dense")
class DENSE(FedAvgCNN):
    config_class = DENSEConfig

    # federation.privacy: not covered (a FedAvgCNN whose server reads each model).
    privacy_gap = never_covered(
        "the server distils from every client's uploaded model, not from their mean: dp_fedavg's noise on a "
        "mean does not cover it"
    )

    true_precision = "its generator, BatchNorm-statistics loss and distillation need float32 master weights"
    federated_evaluation = False  # partition.client_test_fraction: not covered (one-shot distillation; untested)
    bn_per_model = False  # DENSE sums L_BN over all client models; Co-Boosting averages

    @property
    def num_rounds(self) -> int:
        return 1

    def shared_aggregate(self, round_idx: int) -> bool:
        """Every rank synthesises and distils together, each running its shard of the client models (the module
        docstring); not under ``federation.privacy``, whose server steps wrap rank 0's aggregate."""
        return self.env is None or self.env.privacy is None

    def input_spec(self):  # noqa: ANN201 — the generator needs a multiple of 4
        spec = super().input_spec()
        if spec.image_size % 4:
            from fl_lightning.errors import ConfigError

            raise ConfigError("data.image_size", spec.image_size, f"a multiple of 4 for {self.name}'s generator")
        return spec

    # -- client: train once, upload the model ----------------------------------------------------
    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        return RoundPlan({c: Download() for c in clients})  # the initial model is agreed by seed

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        train_s = self.train_client(round_idx, client, self._initial)
        state = {k: v.detach().cpu().clone() for k, v in self.module.model.state_dict().items()}
        return Upload(state, {"num_samples": client.num_samples, "train_s": train_s})

    # -- server: ensemble → generator → student --------------------------------------------------
    def synthesis_settings(self):  # noqa: ANN201
        from fl_lightning.modules.data_free_kd import SynthesisSettings

        c = self.config
        return SynthesisSettings(
            steps=c.g_steps,
            batch_size=c.synthesis_batch_size,
            lr=c.lr_g,
            oh=c.oh,
            bn=c.bn,
            adv=c.adv,
            adv_temperature=c.adv_temperature,
            mask_agreement=c.adv_mask,
            hardness=None,
            bn_per_model=self.bn_per_model,
            augment=c.synthesis_augment,
            clip_grad=c.clip_grad,
        )

    def ods_eta(self) -> float | None:
        """Co-Boosting's hard-sample step size in the distillation (DENSE: none)."""
        return None

    def reweight(
        self, epoch: int, ensemble: nn.Module, pool: Tensor, labels: Tensor, view: Callable[[Tensor, torch.Generator], Tensor]
    ) -> None:
        """Hook after a synthesis, before its batch joins the pool (Co-Boosting re-weights the ensemble here,
        on the pool so far read through ``view``); DENSE: nothing."""

    def local_callbacks(self) -> list[object]:
        c = self.config
        return [] if c.local_clip_grad is None else [ClipGradNorm(c.local_clip_grad)]

    def initial_student(self, num_classes: int) -> nn.Module:
        """S before distillation: a fresh model, drawn under a seed of its own as the official codes draw
        one (``student_init: fresh``), or the clients' common initial model (``clients``). With an ImageNet
        ``model.checkpoint`` both start from it; only the classifier differs."""
        seed = self.cfg.seed if self.config.student_init == "clients" else self.cfg.seed + _STUDENT_SEED_OFFSET
        return build_timm_classifier(self.cfg, num_classes, seed=seed)

    def pool_view(
        self, image_size: int, normalize: Callable[[Tensor], Tensor], device: torch.device
    ) -> Callable[[Tensor, torch.Generator], Tensor]:
        """How distillation (and re-weighting) read the pool: CIFAR's crop (padding S/8 of black) + flip
        (``pool_augment``), or as stored."""
        from fl_lightning.modules.data_free_kd import pool_padding, random_shift_flip

        if not self.config.pool_augment:
            return lambda x, rng: x
        black = normalize(torch.zeros(1, 3, 1, 1, device=device))
        padding = pool_padding(image_size)
        return lambda x, rng: random_shift_flip(x, rng=rng, padding=padding, fill=black)

    def _client_models(
        self, uploads: Mapping[int, Upload], device: torch.device, members: range | None = None
    ) -> tuple[list[nn.Module], float]:
        """The client models of ``members`` (positions in client order; None: all), and every client's train_s."""
        models, train_s = [], 0.0
        for i, upload in enumerate(uploads.values()):
            train_s += float(upload.meta.get("train_s", 0.0))
            if members is not None and i not in members:
                continue
            model = build_timm_classifier(self.cfg, self.env.num_classes, seed=self.cfg.seed)
            model.load_state_dict(upload.tensors)
            models.append(model.to(device).eval().requires_grad_(False))
        return models, train_s

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        from fl_lightning.federation.local_training import fresh_grad_scaler
        from fl_lightning.modules.data_free_kd import Generator, distill_epoch, synthesize

        start = time.monotonic()
        c, device, fabric = self.config, self.fabric.device, self.fabric
        if not uploads:
            raise RuntimeError(f"round {round_idx}: no client uploaded a model; nothing to distil")
        split = splits_work(self.env)  # every rank here together: each runs its shard of the K client models
        k = len(uploads)
        members = Deal.of(fabric).blocks(k) if split else None  # in blocks: gathered in client order
        models, client_train_s = self._client_models(uploads, device, members)
        ensemble = self.make_ensemble(models, num_members=k, split=split).to(device)
        student = self.initial_student(self.env.num_classes).to(device).eval()
        size = self.input_spec().image_size
        generator = Generator(nz=c.nz, ngf=c.ngf, image_size=size, channels=3).to(device)
        mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)

        def normalize(x: Tensor) -> Tensor:
            return (x - mean) / std

        rng = torch.Generator().manual_seed(self.cfg.seed)
        optimizer = torch.optim.SGD(student.parameters(), lr=c.kd_lr, momentum=c.kd_momentum, weight_decay=c.kd_weight_decay)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=c.epochs) if c.kd_schedule == "cosine" else None
        settings = self.synthesis_settings()
        view = self.pool_view(size, normalize, device)
        # the run's precision, as in local training: forwards under autocast; under 16-mixed a GradScaler for
        # each re-drawn G and one for S over all its epochs (None otherwise)
        autocast, student_scaler = self.fabric.autocast, fresh_grad_scaler(self.fabric)
        pool_x: list[Tensor] = []
        pool_y: list[Tensor] = []
        skipped = 0
        for epoch in range(c.epochs):
            images, labels = synthesize(
                generator,
                ensemble,
                student,
                num_classes=self.env.num_classes,
                settings=settings,
                normalize=normalize,
                rng=rng,
                device=device,
                autocast=autocast,
                scaler=fresh_grad_scaler(self.fabric),
            )
            if split:  # rank 0's kept batch (or none) on every rank: the pools never differ
                images = ensemble.rank0_batch(images, labels, (len(labels), 3, size, size))
            if images is None:  # no finite L_G in the whole synthesis: nothing to keep (the module docstring)
                skipped += 1
                if fabric.global_rank == 0:
                    _log.warning(
                        "%s: server epoch %d's synthesis had no finite generator loss; it adds no batch", self.name, epoch
                    )
            else:
                if pool_x:  # Co-Boosting's order: re-weight on the pool so far, before the new batch joins it
                    self.reweight(epoch, ensemble, torch.cat(pool_x), torch.cat(pool_y), view)
                if c.pool == "last":
                    pool_x.clear(), pool_y.clear()
                pool_x.append(images)
                pool_y.append(labels)
            if pool_x:
                distill_epoch(
                    student,
                    ensemble,
                    torch.cat(pool_x),
                    optimizer=optimizer,
                    batch_size=c.batch_size,
                    temperature=c.temperature,
                    rng=rng,
                    ods_eta=self.ods_eta(),
                    clip_grad=c.clip_grad,
                    augment=view,
                    autocast=autocast,
                    scaler=student_scaler,
                )
            if scheduler is not None:
                scheduler.step()
            if split:  # rank 0's student and ensemble weights on every rank: replicas cannot drift apart
                ensemble.rank0_state(student)
        if skipped == c.epochs:
            raise RuntimeError(
                f"{self.name}: no synthesis of the {c.epochs} server epochs had a finite generator loss "
                "(non-finite logits of the client models; try federation.precision 32-true)"
            )
        out = {k: v.detach().cpu().clone() for k, v in student.state_dict().items()}
        out[_STAT + "server_distill_s"] = torch.tensor(time.monotonic() - start, dtype=torch.float64)
        out[_STAT + "client_train_s"] = torch.tensor(client_train_s, dtype=torch.float64)
        out[_STAT + "ensemble_weights"] = ensemble.weights.detach().cpu().clone()
        out[_STAT + "skipped_syntheses"] = torch.tensor(skipped, dtype=torch.int64)
        return {**out, **self._teacher_accuracies(models, ensemble, split=split)}

    def _teacher_accuracies(self, models: list[nn.Module], ensemble: nn.Module, *, split: bool) -> State:
        """The test accuracy of each client model and of the ensemble, as the official code logs them (under the
        run's precision: evaluate_on_test's autocast); on several ranks (``split``) each rank its own client models,
        the accuracies gathered in client order, and the split ensemble on the whole split on every rank."""

        def mine() -> list[float]:
            return [evaluate_on_test(self.env, m, split=False)["accuracy"] for m in models]

        accuracy = (
            Deal.unblock(
                gathered(
                    self.fabric, mine, what="the client models' evaluation", timeout_s=self.cfg.federation.collective_timeout_s
                )
            )
            if split
            else mine()
        )
        ensemble_accuracy = evaluate_on_test(self.env, ensemble, split=False)["accuracy"]
        return {
            _STAT + "client_accuracy": torch.tensor(accuracy, dtype=torch.float64),
            _STAT + "ensemble_accuracy": torch.tensor(ensemble_accuracy, dtype=torch.float64),
        }

    def ensemble_weights(self, num_members: int) -> Tensor | None:
        """The ensemble's initial weights w (K,); None: the plain mean (DENSE's teacher)."""
        return None

    def make_ensemble(self, models: list[nn.Module], *, num_members: int, split: bool) -> nn.Module:
        """The teacher A_w over the client models: all of them on this rank, or (``split``) this rank's shard of the
        ``num_members`` (:class:`~fl_lightning.modules.data_free_kd_ranks.SplitEnsemble`)."""
        from fl_lightning.modules.data_free_kd import WeightedEnsemble
        from fl_lightning.modules.data_free_kd_ranks import SplitEnsemble

        weights = self.ensemble_weights(num_members)
        if split:
            return SplitEnsemble(
                models,
                weights,
                num_members=num_members,
                num_classes=self.env.num_classes,
                timeout_s=self.cfg.federation.compute_timeout_s,
            )
        return WeightedEnsemble(models, weights)

    def summary_extras(self, state: State) -> dict[str, Any]:
        extras = super().summary_extras(state)
        for key in ("server_distill_s", "client_train_s", "ensemble_accuracy"):
            if _STAT + key in state:
                extras[key] = float(state[_STAT + key])
        if _STAT + "skipped_syntheses" in state:
            extras["skipped_syntheses"] = int(state[_STAT + "skipped_syntheses"])
        for key in ("ensemble_weights", "client_accuracy"):
            if _STAT + key in state:
                extras[key] = [round(float(v), 6) for v in state[_STAT + key]]
        return extras
