"""Layer 0, the floor: one schema for every setting and one vocabulary of names.

``schema`` reads and validates a run's TOML (every default filled in; errors name the
key; every problem at once, gathered in a ``Problems`` for ``--check``) and returns the
typed, frozen ``RunConfig`` (``typed``, generated from the schema by ``codegen``), which is
all the rest of the code sees; ``vocabulary`` holds the names every other layer agrees on
(tasks, optimizers, activations, losses, metrics, layer types); ``reference`` renders
docs/config.md from them. Imports nothing from the rest of ``ensemble``.
"""

from ensemble.config.schema import (
                                    ConfigError,
                                    Problems,
                                    dump_toml,
                                    load_config,
                                    locate,
                                    member_train_settings,
                                    read_saved_config,
                                    resolve_config,
)
from ensemble.config.typed import (
                                    ArchitectureConfig,
                                    DataConfig,
                                    EnsembleConfig,
                                    EvolveConfig,
                                    PbtConfig,
                                    RehearsalConfig,
                                    RunConfig,
                                    RuntimeConfig,
                                    TrainConfig,
)

__all__ = ["ArchitectureConfig", "ConfigError", "DataConfig", "EnsembleConfig", "EvolveConfig", "PbtConfig",
           "Problems", "RehearsalConfig", "RunConfig", "RuntimeConfig", "TrainConfig", "dump_toml", "load_config",
           "locate", "member_train_settings", "read_saved_config", "resolve_config"]
