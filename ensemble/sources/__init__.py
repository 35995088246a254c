"""Layer 3: spec sources, what to train next. The master asks ``next_spec()`` whenever a
worker is free and ``tell(result)``s every result (ask/tell, as optuna's study):

- ``members.SpecList``: the fixed member list of an ensemble run;
- ``search.SearchSource``: an ``evolve`` strategy breeding candidates (mode = "evolve");
- ``population.PopulationSource``: population-based training (mode = "pbt"), whose
  ``decide`` holds each round's reports and answers them together.

A new source (a replayed list, a Bayesian optimiser, ...) implements ``base.Source``
(and a new in-training rule ``base.Decider``); see docs/architecture.md. No MPI and no TensorFlow here.
"""

from ensemble.sources.base import Decider, GoOn, Hooks, Source
from ensemble.sources.members import SpecList, derive_seed, member_count, member_specs

__all__ = ["Decider", "GoOn", "Hooks", "Source", "SpecList", "derive_seed", "member_count", "member_specs"]
