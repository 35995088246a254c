"""Layer 0, the floor: one schema for every setting and one vocabulary of names.

``schema`` reads and validates a run's TOML (every default filled in; errors name the
key; every problem at once, gathered in a ``Problems`` for ``--check``); ``vocabulary``
holds the names every other layer agrees on (tasks, optimizers, activations, losses,
metrics, layer types); ``reference`` renders docs/config.md and the strategy settings the
README documents from them. Imports nothing from the rest of ``ensemble``.
"""

from ensemble.config.schema import (ConfigError, Problems, dump_toml, load_config, locate,
                                    member_train_settings, resolve_config)

__all__ = ["ConfigError", "Problems", "dump_toml", "load_config", "locate", "member_train_settings",
           "resolve_config"]
