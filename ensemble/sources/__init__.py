"""Layer 3: spec sources, what to train next. The master asks ``next_spec()`` whenever a
worker is free and ``tell(result)``s every result (ask/tell, as optuna's study):

- ``members.SpecList``: the fixed member list of an ensemble run;
- ``search.SearchSource``: an ``evolve`` strategy breeding candidates (mode = "evolve");
- ``population.PopulationSource``: population-based training (mode = "pbt"), whose
  ``decide`` holds each round's reports and answers them together.

A new source (a replayed list, a Bayesian optimiser, ...) is a class with these two
methods; see docs/architecture.md. No MPI and no TensorFlow here.
"""

from ensemble.sources.members import SpecList, SpecSource, derive_seed, member_count, member_specs

__all__ = ["SpecList", "SpecSource", "derive_seed", "member_count", "member_specs"]
