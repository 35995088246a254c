"""Architecture search without MPI: search space, genome, decoding, operators, strategies.

Typical use on the master::

    space = SearchSpace.from_config(cfg.search, input_rank=len(x.shape) - 1)
    strategy = make_strategy("regularized", space, x.shape[1:], n_outputs, rng_seed=0,
                             budget_evaluations=200, budget_seconds=None)
    g = strategy.ask()                       # None: budget spent or wait for results
    layers = decode(g, x.shape[1:], space, n_outputs)   # layer dicts for the builder
    strategy.tell(g, val_score)              # None for a failed member

``search.space = "structured"`` makes the genomes ``StructuredGenome``s (stages of blocks,
``evolve.structured``); the functions above take either kind, and ``genome_from_dict``
reads either back from its dict. ``templates`` are known-good starting points.
"""

from evolve.decode import Analysis, analyse, check, count_params, decode
from evolve.genome import Genome, LayerGene
from evolve.operators import crossover, mutate, random_genome, tournament
from evolve.repair import repair
from evolve.space import SearchSpace, SpaceError
from evolve.strategies import STRATEGIES, STRATEGY_PARAMS, Setting, Strategy, make_strategy
from evolve.structured import Stage, StructuredGenome, genome_from_dict
from evolve.templates import templates

__all__ = [
    "Analysis", "Genome", "LayerGene", "STRATEGIES", "STRATEGY_PARAMS", "SearchSpace", "Setting", "SpaceError", "Stage",
    "Strategy", "StructuredGenome", "analyse", "check", "count_params", "crossover", "decode",
    "genome_from_dict", "make_strategy", "mutate", "random_genome", "repair", "templates", "tournament",
]
