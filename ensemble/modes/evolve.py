"""mode = "evolve": an architecture search. Its Source breeds candidates with an ``evolve``
strategy (``sources.search``); its Decider is early discarding (``evolve.discard``,
``sources.discard``) or none."""

from __future__ import annotations

from typing import Any

from ensemble.config import Problems, RunConfig
from ensemble.modes.base import Mode, RunContext
from ensemble.sources.base import Decider, GoOn, Source


class EvolveMode(Mode):
    name = "evolve"

    def make(self, ctx: RunContext) -> tuple[Source, Decider]:
        from ensemble.results.records import MemberRecord
        from ensemble.sources.discard import EarlyDiscard
        from ensemble.sources.search import SearchSource
        source = SearchSource(ctx.cfg, ctx.meta, ctx.run_dir, ctx.history, set(ctx.lost))
        discard = EarlyDiscard.from_config(ctx.cfg.evolve, ctx.metric)
        if discard is None:
            return source, GoOn()
        discard.replay(x for x in ctx.history if isinstance(x, MemberRecord))
        return source, discard

    def expected_members(self, cfg: RunConfig, workers: int | None = None) -> int | None:
        return cfg.evolve.evaluations

    def preflight(self, cfg: RunConfig, meta: dict | None, groups: int | None, found: Problems) -> None:
        if meta is None or not found.ok("search", "data.reshape"):
            return
        from ensemble.config import ConfigError
        from ensemble.sources.search import check_search
        with found.catch("search"):
            try:
                check_search(cfg, meta)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    def describe(self, cfg: RunConfig) -> str:
        ev = cfg.evolve
        budget = [f"{ev.evaluations} evaluations"] if ev.evaluations else []
        budget += [f"{ev.time_limit:g} s"] if ev.time_limit else []
        own = ", ".join(f"{k} {v}" for k, v in ev.to_dict().items()
                        if k not in ("strategy", "evaluations", "time_limit"))
        return f"strategy {ev.strategy!r}, budget {' and '.join(budget) or 'none'}" + (f"; {own}" if own else "")

    def pareto(self, cfg: RunConfig, meta: dict) -> Any:
        from ensemble.sources.search import pareto_objectives
        return pareto_objectives(cfg, meta)
