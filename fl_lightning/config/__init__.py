"""A run's configuration: the schema (``schema.py``) exported here, and the modules that read and write configs.

``from fl_lightning.config import RunConfig`` (or a core section, or one of the allowed-value tuples) is the
schema and nothing more: importing this package imports no YAML, no registry and no method, so every layer may
import it. Reading a config is its own module's, imported from there:

* :mod:`fl_lightning.config.loading` — ``load_config`` (the entry point), ``build_config``, ``schema_keys``,
  ``config_to_dict``, ``dump_config``: the strict loader and its inverse; it reads the algorithm registry;
* :mod:`fl_lightning.config.yaml_io` — a config's text as plain mappings (YAML files, ``--dotted.key``
  overrides, merge);
* :mod:`fl_lightning.config.history` — configs written earlier (a method's former name, keys added since);
* :mod:`fl_lightning.config.variants` — a comparison's runs (``variants`` × ``sweep``).

This package does not re-export the loader: the loader imports the registry, whose modules import the schema
from here, so a re-export would close a circle (``tests/test_import_graph.py``).
"""

from fl_lightning.config.schema import (
    ACCELERATORS,
    ATTACKS,
    CORE_SECTIONS,
    PRECISIONS,
    PRIVACY_MECHANISMS,
    AggregatorConfig,
    AttackConfig,
    ClientBehaviourConfig,
    DataConfig,
    FederationConfig,
    LocalTrainingConfig,
    LoggingConfig,
    ModelConfig,
    PartitionConfig,
    PrivacyConfig,
    RunConfig,
    ServerOptimizerConfig,
)

__all__ = [
    "DataConfig",
    "PartitionConfig",
    "ModelConfig",
    "FederationConfig",
    "PrivacyConfig",
    "PRIVACY_MECHANISMS",
    "ServerOptimizerConfig",
    "AttackConfig",
    "ATTACKS",
    "AggregatorConfig",
    "ClientBehaviourConfig",
    "LocalTrainingConfig",
    "LoggingConfig",
    "RunConfig",
    "CORE_SECTIONS",
    "PRECISIONS",
    "ACCELERATORS",
]  # check lives in fl_lightning.errors (method configs import it from there, not from here)
