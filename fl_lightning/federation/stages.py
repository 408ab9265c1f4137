"""Multi-phase methods as a short declaration of stages (synthesis → fine-tuning, prompts → statistics).

A :class:`Stage` owns a run of consecutive rounds, the config dataclass of the keys it reads, and the
round interface of :class:`~fl_lightning.federation.algorithm.Algorithm` for those rounds
(``plan`` / ``client_update`` / ``expected_shapes`` / ``aggregate``). A :class:`StagedAlgorithm`
declares its stages in order and hands round t to the stage that owns it; it keeps what is shared by
all of them (the model, the evaluation, the summary).

A method's section is composed from its stages' config dataclasses by inheritance
(``class SFLFConfig(ImageNetInitConfig, LoRAFineTuningConfig)``): the keys users write stay those of
the stages, and a key that no stage reads is an unknown-key error of the strict loader. Every stage
config derives from :class:`StageConfig` and calls ``super().__post_init__()`` first, so the checks of
every stage run. A baseline that differs in one phase swaps that stage.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fl_lightning.federation.algorithm import Algorithm, Client, RoundHistory, RoundPlan, State
from fl_lightning.federation.transport import Download, Upload

if TYPE_CHECKING:
    from lightning.fabric import Fabric

    from fl_lightning.config import RunConfig
    from fl_lightning.federation.ranks.summed_uploads import UploadSum

__all__ = ["Stage", "StageConfig", "StagedAlgorithm"]


@dataclass
class StageConfig:
    """Base of every stage's config: cooperative checks (each subclass calls ``super().__post_init__()``)."""

    def __post_init__(self) -> None:
        pass


class Stage(ABC):
    """One phase of a method: its rounds ``first_round .. first_round + num_rounds − 1``.

    ``self.method`` is the :class:`StagedAlgorithm` it belongs to (its ``cfg``, ``config``, ``env`` and
    shared model), or None for a stage that is handed its collaborators instead (FedOPAL's: see
    :meth:`StagedAlgorithm.make_stage`); round indices are the run's own, so seeds and checkpoints do not
    depend on stages.
    """

    config_class: type = StageConfig  # the keys this stage reads (the method's section extends it)

    # its aggregate runs on every rank together (Algorithm.shared_aggregate), sharing its work over the ranks
    shared_aggregate: bool = False

    def __init__(self, method: StagedAlgorithm | None, first_round: int) -> None:
        self.method = method
        self.first_round = first_round

    @classmethod
    def missing_resources(cls, config: Any, section: str, *, download: bool = False) -> list[str]:
        """Weights this stage needs that are not on disk (one phrase each, for the preflight); ``download``: a
        hub id missing from the cache will be fetched (``model.download``)."""
        return []

    def rounds(self) -> int:
        """How many rounds this stage owns (0: it only contributes to the initial state)."""
        return 1

    def build(self, fabric: Fabric) -> None:
        """What this stage needs on every rank, built once before data (e.g. Stable Diffusion's VAE)."""

    def initial_state(self) -> State:
        """This stage's part of the global state before round 0."""
        return {}

    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        return RoundPlan({c: Download() for c in clients})

    @abstractmethod
    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        """Local work of one client in a round of this stage."""

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]] | None:
        return None

    @abstractmethod
    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        """Server step of a round of this stage (see :meth:`Algorithm.aggregate`)."""

    def summed_uploads(self, round_idx: int) -> UploadSum | None:
        """See :meth:`Algorithm.summed_uploads`."""
        return None

    def summary_extras(self, state: State) -> dict[str, Any]:
        return {}


class StagedAlgorithm(Algorithm):
    """An :class:`Algorithm` made of stages run one after the other; round t goes to the stage owning it.

    Subclasses set ``stages`` (or override :meth:`stages_for` where a config key picks a stage, e.g.
    FeDiSyn's ``generation``) and a ``config_class`` that extends every stage's ``config_class``.
    """

    stages: tuple[type[Stage], ...] = ()

    @classmethod
    def stages_for(cls, config: Any) -> tuple[type[Stage], ...]:
        return cls.stages

    def __init__(self, *, cfg: RunConfig) -> None:
        super().__init__(cfg=cfg)
        self.parts: list[Stage] = []
        first = 0
        for stage_class in self.stages_for(self.config):
            if not isinstance(self.config, stage_class.config_class):
                raise TypeError(
                    f"{type(self).__name__}.config_class must extend {stage_class.__name__}'s {stage_class.config_class.__name__}"
                )
            self.parts.append(self.make_stage(stage_class, first))
            first += self.parts[-1].rounds()

    def make_stage(self, stage_class: type[Stage], first_round: int) -> Stage:
        """The stage of ``stage_class`` owning rounds from ``first_round``: given this method; a method whose
        stages take their collaborators explicitly (FedOPAL) hands them over here instead."""
        return stage_class(self, first_round)

    @classmethod
    def preflight(cls, cfg: RunConfig) -> None:
        from fl_lightning.errors import MissingResourceError

        download = cfg.model.download  # one switch for every weight named by hub id (models/hub.py)
        missing = [
            m for stage in cls.stages_for(cfg.method) for m in stage.missing_resources(cfg.method, cls.name, download=download)
        ]
        missing += cls.missing_resources(cfg.method, cls.name, download=download)
        if missing:
            raise MissingResourceError(
                f"{cls.__name__} needs weights that are not on disk: "
                + "; ".join(dict.fromkeys(missing))
                + " — copy them there or change the paths "
                "(a hub id is read from the Hugging Face cache; model.download: true fetches)"
            )

    @classmethod
    def missing_resources(cls, config: Any, section: str, *, download: bool = False) -> list[str]:
        """Weights the method itself needs beyond its stages'."""
        return []

    @property
    def num_rounds(self) -> int:
        return sum(stage.rounds() for stage in self.parts)

    def stage_of(self, round_idx: int) -> Stage:
        """The stage that owns round ``round_idx``."""
        for stage in self.parts:
            if stage.first_round <= round_idx < stage.first_round + stage.rounds():
                return stage
        raise IndexError(f"round {round_idx} is beyond the {self.num_rounds} rounds of {type(self).__name__}")

    def build(self, fabric: Fabric) -> None:
        super().build(fabric)
        for stage in self.parts:
            stage.build(fabric)

    def initial_state(self) -> State:
        state: State = {}
        for stage in self.parts:
            state.update(stage.initial_state())
        return state

    def plan(self, round_idx: int, clients: Sequence[int], state: State, history: RoundHistory) -> RoundPlan:
        return self.stage_of(round_idx).plan(round_idx, clients, state, history)

    def client_update(self, round_idx: int, client: Client, download: Download) -> Upload:
        return self.stage_of(round_idx).client_update(round_idx, client, download)

    def expected_shapes(self, round_idx: int, download: Download) -> dict[str, tuple[int, ...]] | None:
        return self.stage_of(round_idx).expected_shapes(round_idx, download)

    def aggregate(
        self, round_idx: int, state: State, uploads: Mapping[int, Upload], failures: dict[int, str], plan: RoundPlan
    ) -> State:
        return self.stage_of(round_idx).aggregate(round_idx, state, uploads, failures, plan)

    def shared_aggregate(self, round_idx: int) -> bool:
        return self.stage_of(round_idx).shared_aggregate

    def summed_uploads(self, round_idx: int) -> UploadSum | None:
        return self.stage_of(round_idx).summed_uploads(round_idx)

    def summary_extras(self, state: State) -> dict[str, Any]:
        out: dict[str, Any] = dict(super().summary_extras(state))
        for stage in self.parts:
            out.update(stage.summary_extras(state))
        return out
