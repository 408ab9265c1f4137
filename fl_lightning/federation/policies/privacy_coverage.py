"""Which (method, mechanism) pairs ``federation.privacy`` covers end to end, and the one line that refuses the rest.

A pair is covered when every upload that reaches the server is clipped and noised by the mechanism, or is
data-independent; the run's ε is then a bound that holds. A method states its own coverage in its own file, as
a classmethod ``privacy_gap(cfg) -> str | None`` (None: covered; else what would leak, in words) — written
``privacy_gap = gap_by(weights_only)`` or ``never_covered("...")`` where the rule is a shared one. The method's
class must declare it itself — it is never inherited (DENSE is a FedAvgCNN, but the server distils from each
client's model, which DP-FedAvg's noise on a mean does not cover), so a method that says nothing is refused.

The pairs are checked before a run starts (:func:`check_privacy_coverage`, one line and exit 2), and checked
again on every upload as the aggregate reads it (``federation/policies/privacy.py``: an uncovered tensor stops the run).
:func:`coverage_table` is the table of docs/privacy.md (``tests/privacy/test_coverage.py`` checks the page).

Example::

    python -m fl_lightning.train --config conf/fedpft_digits_tiny.yaml --federation.privacy.mechanism dp_fedavg \
        --federation.privacy.epsilon 8 --federation.privacy.delta 0.01
    # usage error: federation.privacy.mechanism=dp_fedavg does not protect fedpft: ... (exit 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fl_lightning.errors import UsageError

if TYPE_CHECKING:
    from fl_lightning.config import RunConfig

__all__ = [
    "MECHANISMS",
    "privacy_gap",
    "coverage_refusal",
    "check_privacy_coverage",
    "coverage_table",
    "weights_only",
    "statistics_only",
    "never_covered",
    "gap_by",
]

MECHANISMS = ("dp_fedavg", "statistics_local", "statistics_central")


def weights_only(cfg: RunConfig) -> str | None:
    """The gap of a method that uploads only weights of the global state (FedAvg's kind): DP-FedAvg covers them."""
    if cfg.federation.privacy.mechanism == "dp_fedavg":
        return None
    return "it uploads model weights, which only dp_fedavg clips and noises (the statistics mechanisms noise R_k, C_k)"


def statistics_only(cfg: RunConfig) -> str | None:
    """The gap of a method that uploads only the sufficient statistics (AFL's kind): the statistics mechanisms
    cover them."""
    if cfg.federation.privacy.mechanism.startswith("statistics"):
        return None
    return (
        "it uploads the statistics R_k, C_k, not weights of the global state: dp_fedavg would neither clip nor "
        "noise them (use statistics_local or statistics_central)"
    )


def never_covered(reason: str) -> classmethod:
    """A method's ``privacy_gap`` when no mechanism covers it, whatever the run: what would leak, in words.

    Example:
        >>> privacy_gap = never_covered("its synthesis round uploads captions of each client's images in the clear")
    """
    return classmethod(lambda cls, cfg: reason)


def gap_by(rule: Callable[[RunConfig], str | None]) -> classmethod:
    """A method's ``privacy_gap`` that is ``rule``'s: :func:`weights_only`, :func:`statistics_only`, or another
    method's (``gap_by(Scaffold.privacy_gap)``: covered as Scaffold is)."""
    return classmethod(lambda cls, cfg: rule(cfg))


def privacy_gap(algorithm: type, cfg: RunConfig) -> str | None:
    """What of ``algorithm``'s uploads ``cfg.federation.privacy.mechanism`` would leave unprotected (None: nothing).

    Only the class's own ``privacy_gap`` counts, never an inherited one (module docstring)."""
    own = algorithm.__dict__.get("privacy_gap")
    if own is None:
        return "it does not declare which of its uploads the mechanism clips and noises, so none is taken as covered"
    return own.__get__(None, algorithm)(cfg)


def coverage_refusal(cfg: RunConfig, algorithm: type) -> str | None:
    """Why the run's mechanism does not cover ``algorithm``, in one line (None: it does, or privacy is off)."""
    mechanism = cfg.federation.privacy.mechanism
    if mechanism == "off":
        return None
    gap = privacy_gap(algorithm, cfg)
    if gap is None:
        return None
    return (
        f"federation.privacy.mechanism={mechanism} does not protect {cfg.algorithm}: "
        f"{gap}; no ε would hold (docs/privacy.md, 'What each method's privacy covers')"
    )


def check_privacy_coverage(cfg: RunConfig, algorithm: type) -> None:
    """Refuse, in one line (:class:`UsageError`, exit 2), a run whose method the mechanism does not cover."""
    refusal = coverage_refusal(cfg, algorithm)
    if refusal is not None:
        raise UsageError(f"usage error: {refusal}")


def coverage_table() -> str:
    """docs/privacy.md's table: every registered method against every mechanism, as :func:`privacy_gap` says."""
    from fl_lightning.algorithms import available_algorithms

    lines = ["| method | " + " | ".join(f"`{m}`" for m in MECHANISMS) + " |", "| --- |" + " --- |" * len(MECHANISMS)]
    for name, algorithm in sorted(available_algorithms().items()):
        if not algorithm.__module__.startswith("fl_lightning."):  # a method a test registered
            continue
        cells = [_cell(name, algorithm, m) for m in MECHANISMS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(name: str, algorithm: type, mechanism: str) -> str:
    plain = privacy_gap(algorithm, _config(name, algorithm, mechanism, dp_sgd=False))
    if not mechanism.startswith("statistics"):
        return "covered" if plain is None else f"refused: {plain}"
    with_sgd = privacy_gap(algorithm, _config(name, algorithm, mechanism, dp_sgd=True))
    if plain == with_sgd:
        return "covered" if plain is None else f"refused: {plain}"
    if with_sgd is None:
        return f"covered with `dp_sgd: true`; without it refused: {plain}"
    return f"refused: {plain}; with `dp_sgd: true`: {with_sgd}"


def _config(name: str, algorithm: type, mechanism: str, *, dp_sgd: bool) -> RunConfig:
    """The method's default run under ``mechanism`` (a target ε of 1)."""
    from fl_lightning.config import FederationConfig, PrivacyConfig, RunConfig

    privacy = PrivacyConfig(mechanism=mechanism, epsilon=1.0, dp_sgd=dp_sgd)
    return RunConfig(algorithm=name, federation=FederationConfig(privacy=privacy), method=algorithm.config_class())
