"""mode = "evolve": an architecture search. Its Source breeds candidates with an ``evolve``
strategy (``sources.search``); its Decider is early discarding (``evolve.discard``,
``sources.discard``) or none."""

from __future__ import annotations

from typing import Any

from ensemble.config import Problems, RunConfig
from ensemble.modes.base import Mode, RunContext, Sample
from ensemble.results.rundir import RunDirectory
from ensemble.sources.base import Decider, GoOn, Source

#: genomes of the search space ``--check`` builds
SAMPLE_GENOMES = 5


class EvolveMode(Mode):
    name = "evolve"
    tables = ("evolve", "search")
    uses_architectures = False
    gives_up_crashers = True
    quarantines = False            # its candidates go out again in their order: a resumed search equals the
                                   # uninterrupted one (holding one back let the strategy breed early)

    def make(self, ctx: RunContext) -> tuple[Source, Decider]:
        from ensemble.results.records import MemberRecord
        from ensemble.sources.discard import EarlyDiscard
        from ensemble.sources.search import SearchSource
        source = SearchSource(ctx.cfg, ctx.meta, ctx.run_dir, ctx.history, set(ctx.lost), ctx.workers)
        discard = EarlyDiscard.from_config(ctx.cfg.evolve, ctx.metric)
        if discard is None:
            return source, GoOn()
        discard.replay(x for x in ctx.history if isinstance(x, MemberRecord))
        return source, discard

    def expected_members(self, cfg: RunConfig, workers: int | None = None) -> int | None:
        return cfg.evolve.evaluations

    def hierarchy_problem(self, cfg: RunConfig) -> str | None:
        if cfg.evolve.discard == "off":
            return None
        return f"`evolve.discard = \"{cfg.evolve.discard}\"` decides at the master while candidates train"

    def preflight(self, cfg: RunConfig, meta: dict | None, groups: int | None, found: Problems,
                  resumed: RunDirectory | None = None) -> None:
        if meta is None or not found.ok("search", "data.reshape"):
            return
        from ensemble.config import ConfigError
        from ensemble.sources.search import check_search, search_space
        with found.catch("search"):
            try:
                check_search(cfg, meta)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        from ensemble.sources.earlier import start_genomes, started_from
        if cfg.evolve.start_from and found.ok("search", "evolve.start_from") and \
                "evolve.start_from" not in started_from(resumed):
            try:
                start_genomes(cfg.evolve.start_from, meta, search_space(cfg, meta), 1)
            except (ConfigError, ValueError) as exc:
                found.add(str(exc), "evolve.start_from")

    def notes(self, cfg: RunConfig, meta: dict) -> list[str]:
        from ensemble.config import ConfigError
        from ensemble.sources.search import search_space
        try:
            space = search_space(cfg, meta)
        except (ConfigError, ValueError):           # a bad space is the preflight's problem
            return []
        unused = space.unused_keys(cfg.search)
        if not unused:
            return []
        keys = ", ".join(f"`search.{k}`" for k in unused)
        if space.structured:
            why = (f"the search's genome is structured (`search.space`, for samples of shape "
                   f"{list(meta['input_shape'])}): its depth is `search.stages` x `search.blocks` "
                   "conv blocks, then `search.dense_layers`; set those, or `search.space = \"free\"`")
        else:
            why = ("the search's genome is the free layer list: its depth is `search.min_depth`..`search.max_depth`; "
                   "set those, or `search.space = \"structured\"` (spatial input)")
        return [f"{keys} {'is' if len(unused) == 1 else 'are'} not read: {why}"]

    def describe(self, cfg: RunConfig) -> str:
        ev = cfg.evolve
        budget = [f"{ev.evaluations} evaluations"] if ev.evaluations else []
        budget += [f"{ev.time_limit:g} s"] if ev.time_limit else []
        own = ", ".join(f"{k} {v}" for k, v in ev.to_dict().items()
                        if k not in ("strategy", "evaluations", "time_limit") and v not in ("", None, [], {}))
        text = f"strategy {ev.strategy!r}, budget {' and '.join(budget) or 'none'}" + (f"; {own}" if own else "")
        from ensemble.sources.search import first_population
        try:
            first = first_population(cfg)
        except (KeyError, ValueError):             # settings the config check reports
            first = None
        if ev.evaluations and first and ev.evaluations <= first:
            text += (f". Note: the first population is {first} genomes, so {ev.evaluations} evaluations breed "
                     f"nothing (starting points and random genomes only): raise `evolve.evaluations` above {first}")
        return text

    def sample(self, cfg: RunConfig, meta: dict, found: Problems) -> tuple[list[str], list[Sample]]:
        """The search space for this data and ``SAMPLE_GENOMES`` seeded genomes of it."""
        import numpy as np

        from ensemble.config import ConfigError
        from ensemble.config.vocabulary import OPTIMIZER_SLOTS, VALUE_BYTES
        from ensemble.sources.search import search_space
        from evolve import decode, random_genome
        if not found.ok("search", "data.reshape"):
            return [], []
        try:
            space = search_space(cfg, meta)
        except (ConfigError, ValueError) as exc:
            found.add(str(exc), "search")
            return [], []
        shape, n_out = tuple(meta["input_shape"]), meta["n_outputs"]
        slots = max(OPTIMIZER_SLOTS[o] for o in space.optimizers)
        if not space.structured:
            form = f"layer types {', '.join(space.layer_types)}; depth {space.min_depth}..{space.max_depth}"
        elif space.spatial:
            form = (f"structured: {space.stages[0]}..{space.stages[1]} stages of {space.blocks[0]}..{space.blocks[1]}"
                    f" conv blocks, then {space.dense_layers[0]}..{space.dense_layers[1]} dense layers")
        else:
            form = f"structured: {space.blocks[0]}..{space.blocks[1]} dense blocks"
        heading = [f"Search space for samples of shape {list(shape)}: {form}; at most {space.max_params:,} parameters",
                   f"  a genome at that cap needs "
                   f"{VALUE_BYTES * (2 + slots) * space.max_params / 2 ** 20:.3g} MiB for weights, gradients and "
                   "optimizer state alone",
                   f"  a seeded sample of {SAMPLE_GENOMES} genomes (not the search's own first candidates) follows"]
        if len(shape) == 2 and space.spatial:
            heading.insert(1, f"  samples of shape {list(shape)} are read as {shape[0]} steps of {shape[1]} "
                              f"channel(s) (1-D convolutions); for images set `data.reshape = {[*shape, 1]}`")
        elif len(shape) == 1 and shape[0] >= 16 and not meta.get("feature_names"):      # arrays, not a table
            heading.insert(1, f"  samples are flat ({shape[0]} values): the search tries dense networks; if the values "
                              f"are ordered (a spectrum, a signal), `data.reshape = {[shape[0], 1]}` lets it try "
                              "1-D convolutions")
        rng = np.random.default_rng(cfg.seed)
        samples = []
        for n in range(1, SAMPLE_GENOMES + 1):
            genome = random_genome(rng, space, shape, n_out)
            spec = {"layers": decode(genome, shape, space, n_out), "model": None, "params": {},
                    "loss": cfg.train.loss, "batch_size": genome.batch_size, "optimizer": genome.optimizer}
            samples.append(Sample(f"genome {n}", "search", spec, genome.summary(shape)))
        return heading, samples

    def ranks_hint(self, cfg: RunConfig) -> str:
        return ""

    def search_time_limit(self, cfg: RunConfig) -> tuple[float, str] | None:
        return (cfg.evolve.time_limit, "`evolve.time_limit`") if cfg.evolve.time_limit else None

    def starts_from(self, cfg: RunConfig) -> tuple[str, str] | None:
        return (cfg.evolve.start_from, "evolve.start_from") if cfg.evolve.start_from else None

    def searched_seconds(self, records) -> float:
        from ensemble.results.records import searched_seconds
        return searched_seconds(records)

    def pareto(self, cfg: RunConfig, meta: dict) -> Any:
        from ensemble.sources.search import pareto_objectives
        return pareto_objectives(cfg, meta)
