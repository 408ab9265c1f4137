"""FedAvg (McMahan et al. 2017) of a whole timm classifier: FedOPAL's "FedAvg (ResNet)" baseline.

Backbone: a timm CNN trained end to end by every client, by default ``model.name: resnet18``
(``model.library`` must be ``timm``). It starts from ImageNet weights when ``model.checkpoint`` names
a local weights file (timm's loader drops the file's 1000-class ``fc`` and draws a fresh one for our
classes), and from timm's random initialisation otherwise. Tests use a tiny ResNet through
``model.overrides`` (``layers``, ``channels``, ``stem_width``). The same client model is what
DENSE and Co-Boosting (``dense.py``, ``coboosting.py``) train; their official code's CIFAR-style
ResNet-18 (3×3 stride-1 stem, no max-pool) is ``model.name: cifar_resnet18``
(:mod:`fl_lightning.models.cifar_resnet`, registered with timm).

Each round, the sampled clients load the global weights, train all parameters for ``train.epochs``
epochs with cross-entropy (``train.*``: optimizer, lr, momentum, weight decay, batch size), and upload
the whole state dict (parameters and BatchNorm buffers) with their sample count. The server averages
every tensor, w = Σ_k n_k w_k / Σ_k n_k (``fedavg_cnn.weighted``; plain mean otherwise), folding the
uploads one at a time in float64 (server memory: two models, whatever K). BatchNorm's integer batch
counters are averaged and rounded, as a state dict average does.

Core keys not used: ``model.pretrained`` (only ``model.checkpoint`` gives weights: a local file, or a hub
id read from the Hugging Face cache, fetched only with ``model.download``), ``model.feature`` (no feature head:
the model is the classifier). Images are ImageNet-normalised at ``data.image_size`` (default 32);
``fedavg_cnn.augment`` turns on CIFAR's augmentation (zero-pad by S/8 — 4 px at 32 px —, random S×S crop,
horizontal flip; ``data/transforms.py``); FedOPAL does not say whether its FedAvg (ResNet) row augments, so the default is off.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor, nn

from fl_lightning.algorithms.common import evaluate_on_test
from fl_lightning.errors import ConfigError, MissingResourceError
from fl_lightning.federation.aggregate import mean_of_uploads
from fl_lightning.federation.algorithm import Algorithm, Client, Environment, InputSpec, RoundPlan, State, every_key, register
from fl_lightning.federation.local_training import fit_local
from fl_lightning.federation.policies.privacy_coverage import gap_by, weights_only
from fl_lightning.federation.precision import convert_module
from fl_lightning.federation.transport import Download, Upload
from fl_lightning.modules.optim import make_optimizer

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = ["FedAvgCNN", "FedAvgCNNConfig", "ImageClassifier", "build_timm_classifier"]

_DEFAULT_IMAGE_SIZE = 32


@dataclass
class FedAvgCNNConfig:
    weighted: bool = True  # weight client models by their sample counts (McMahan et al.)
    augment: bool = False  # CIFAR's pad (S/8) + random crop + horizontal flip on the clients' images


def build_timm_classifier(cfg: RunConfig, num_classes: int, *, seed: int) -> nn.Module:
    """``timm.create_model(model.name, num_classes)`` with ``model.overrides``; ImageNet weights from
    ``model.checkpoint`` when given (classifier re-drawn), else random; initialised under ``seed``
    (the global RNG is left as it was)."""
    import timm

    import fl_lightning.models.cifar_resnet  # noqa: F401 — registers cifar_resnet18 / cifar_resnet34 with timm

    m = cfg.model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if m.checkpoint is None:
            return timm.create_model(m.name, pretrained=False, num_classes=num_classes, **m.overrides)
        from fl_lightning.models.hub import resolve_weights_file

        # a file, a folder holding one, or a hub id (its snapshot in the HF cache)
        file = resolve_weights_file(m.checkpoint, download=m.download, cache_dir=m.cache_dir)
        try:
            return timm.create_model(
                m.name, pretrained=True, num_classes=num_classes, pretrained_cfg_overlay=dict(file=file), **m.overrides
            )
        except (RuntimeError, KeyError, ValueError) as err:
            raise MissingResourceError(
                f"model.checkpoint {m.checkpoint} does not fit timm {m.name}: {str(err).splitlines()[0][:300]}"
            ) from None


class ImageClassifier(LightningModule):
    """A whole classifier trained with cross-entropy on all of its parameters (a FedAvg client).

    Args:
        model: images (B, 3, S, S) → logits (B, C).
        optimizer, lr, momentum, weight_decay: the local optimiser (``train.*``).
    """

    def __init__(
        self, *, model: nn.Module, optimizer: str = "sgd", lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 0.0
    ) -> None:
        super().__init__()
        self.model = model
        self._opt = dict(name=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self.model.parameters(), **self._opt)


def _cpu_state(model: nn.Module) -> State:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


@register("fedavg_cnn", renamed_from=("fedavg_resnet",))  # any timm CNN, not ResNet only
class FedAvgCNN(Algorithm):
    averages_weights = True  # aggregate(): the weighted mean of its uploads (federation/policies/order.py)
    config_class = FedAvgCNNConfig
    averaged_keys = every_key  # every key of the state (weights, buffers) is the uploads' weighted mean

    # federation.privacy: DP-FedAvg covers the weights and float buffers (a client's integer buffers stay with it;
    # federation/policies/privacy_coverage.py).
    privacy_gap = gap_by(weights_only)

    # bf16-true / 16-true: the whole CNN (BatchNorm's running statistics too) in half precision, as fabric.setup
    # converts it; the uploads, the average and the evaluation in that dtype (docs/gpu.md)
    true_precision = None
    shared_evaluation = True  # evaluate(state) is the test split through common.py: every rank its shard
    federated_evaluation = True  # the global model through common.py: the clients' test rows too

    @property
    def augment(self) -> bool:  # type: ignore[override]
        return self.config.augment

    @classmethod
    def preflight(cls, cfg: RunConfig) -> None:
        if cfg.model.library != "timm":
            raise ConfigError(
                "model.library", cfg.model.library, f"'timm' for {cfg.algorithm} (a timm CNN, e.g. model.name: resnet18)"
            )
        if cfg.model.checkpoint is not None:
            from fl_lightning.models.weights import check_checkpoint

            check_checkpoint(cfg.model.checkpoint)

    # -- set-up ----------------------------------------------------------------------------------
    def input_spec(self) -> InputSpec:
        # augment: CIFAR's zero-pad (S/8: 4 px at 32) + random crop + horizontal flip (data/transforms.py)
        return InputSpec(self.cfg.data.image_size or _DEFAULT_IMAGE_SIZE, "imagenet", augmentation="crop_flip")

    def local_callbacks(self) -> list[object]:
        """Callbacks of the local training (``fit_local``); Co-Boosting clips gradients here."""
        return []

    def setup(self, env: Environment) -> None:
        super().setup(env)
        t = self.cfg.train
        model = build_timm_classifier(self.cfg, env.num_classes, seed=self.cfg.seed)
        module = ImageClassifier(model=model, optimizer=t.optimizer, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        self.module = convert_module(self.fabric, self.fabric.to_device(module))  # *-true: in half precision
        self._initial = _cpu_state(model)  # identical on every rank: built under cfg.seed
        self._shapes = {k: tuple(v.shape) for k, v in self._initial.items()}

    def initial_state(self) -> State:
        return {k: v.clone() for k, v in self._initial.items()}

    # -- client ----------------------------------------------------------------------------------
    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]]:
        return self._shapes

    def train_client(self, round_idx: int, client: Client, weights: Mapping[str, Tensor]) -> float:
        """Load ``weights`` and train the whole model on the client's data; returns the seconds it took."""
        self.module.model.load_state_dict(weights)
        start = time.monotonic()
        if client.num_samples and self.cfg.train.epochs:
            loader = self.env.client_loader(client, round_idx)
            fit_local(self.fabric, self.module, loader, epochs=self.cfg.train.epochs, callbacks=self.local_callbacks())
        return time.monotonic() - start

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        self.train_client(round_idx, client, download.tensors)
        # the module's own tensors, not a copy: the engine snapshots an upload before the next client trains
        # (round_store.py), so a second copy here would only double the per-client cost
        state = {k: v.detach() for k, v in self.module.model.state_dict().items()}
        return Upload(state, {"num_samples": client.num_samples})

    # -- server ----------------------------------------------------------------------------------
    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        return mean_of_uploads(state, uploads, weighted=self.config.weighted)

    def evaluate(self, state: State) -> dict[str, Any]:
        model = self.module.model
        model.load_state_dict({k: v.to(self.fabric.device) for k, v in state.items() if k in self._initial})
        model.eval()
        return evaluate_on_test(self.env, model)

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {
            "backbone": f"timm {self.cfg.model.name}",
            "imagenet_init": self.cfg.model.checkpoint is not None,
            "num_parameters": sum(v.numel() for k, v in self._initial.items() if v.is_floating_point()),
        }
