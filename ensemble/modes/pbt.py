"""mode = "pbt": population-based training. One object (``sources.population``) is both its
Source and its Decider: members train round by round and the rounds decide who copies
whom; each member trains with ``train.population``, its state sent worker to worker."""

from __future__ import annotations

from typing import Any

from ensemble.config import Problems, RunConfig
from ensemble.modes.base import Mode, RunContext, Sample
from ensemble.results.events import Event, EventKind
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import OneByOne, Trainer
from ensemble.sources.base import Decider, Source


class PbtMode(Mode):
    def starts_from(self, cfg: RunConfig) -> tuple[str, str] | None:
        return (cfg.pbt.start, "pbt.start") if cfg.pbt.start else None

    name = "pbt"
    tables = ("pbt",)
    master_may_train = False           # members send each other their weights over MPI: not from a thread
    reads_streams = False              # train.population gathers its batches from the arrays in memory
    takes_helpers = False              # rounds, not last members
    one_shot_members = False           # synchronous rounds of the whole population
    members_end_apart = False          # all at the last round: its progress is in rounds (status_lines)

    def make(self, ctx: RunContext) -> tuple[Source, Decider]:
        from ensemble.sources.population import PopulationSource
        source = PopulationSource(ctx.cfg, ctx.meta, ctx.run_dir, ctx.history, ctx.workers)
        return source, source

    def expected_members(self, cfg: RunConfig, workers: int | None = None) -> int | None:
        return cfg.pbt.population or workers or None          # 0: one per worker group

    def keras_trainer(self, cfg: RunConfig, meta: dict, data: Any, run_dir: RunDirectory, rank: int,
                      group: Any = None, comm: Any = None) -> Trainer:
        from ensemble.train.member import guarded
        from ensemble.train.population import train_population_member
        sleep = cfg.runtime.poll_max_sleep
        return OneByOne(lambda spec, report: guarded(lambda: train_population_member(
            spec, data, meta, run_dir, comm, group, report, sleep), spec, rank, watched=False))    # the whole run

    def preflight(self, cfg: RunConfig, meta: dict | None, groups: int | None, found: Problems,
                  resumed: RunDirectory | None = None) -> None:
        population = cfg.pbt.population
        if groups is not None and population > groups and found.ok("pbt.population"):
            found.add(f"`pbt.population` = {population} needs as many worker groups, but this job has {groups}: "
                      "each group holds one member for the whole run; start more ranks (mpirun -n "
                      f"{population * cfg.runtime.group_size + 1}) or set `pbt.population = 0` (one member per "
                      "group)", "pbt.population")
        from ensemble.sources.earlier import started_from
        if meta is not None and cfg.pbt.start and found.ok("pbt.start") and "pbt.start" not in started_from(resumed):
            from ensemble.config import ConfigError
            from ensemble.sources.population import search_winners
            try:
                search_winners(cfg.pbt.start, 1, meta, cfg.train.to_dict())
            except (ConfigError, ValueError) as exc:
                found.add(str(exc), "pbt.start")

    def describe(self, cfg: RunConfig) -> str:
        pbt = cfg.pbt
        return (f"population {pbt.population or 'one per worker group'}, {pbt.rounds} rounds of "
                f"{pbt.round_epochs} epochs, exploit {pbt.exploit!r}, explore {pbt.explore!r} "
                f"({', '.join(pbt.hyperparameters)})")

    def sample(self, cfg: RunConfig, meta: dict, found: Problems) -> tuple[list[str], list[Sample]]:
        if cfg.pbt.start:                  # the evolve run's candidates: checked by preflight
            return [f"Starting population: the best candidates of {cfg.pbt.start}"], []
        return super().sample(cfg, meta, found)

    def ranks_hint(self, cfg: RunConfig) -> str:
        n = cfg.pbt.population
        return (f"; a population of {n} needs -n {1 + n * cfg.runtime.group_size} or more" if n else
                "; the population has one member per group, so P sets its size")

    def status_section(self, cfg: RunConfig | None, events: list[Event]) -> dict | None:
        from ensemble.task.metrics import higher_is_better
        rounds = [e.data for e in events if e.kind is EventKind.PBT_ROUND]
        out: dict = {"round": rounds[-1]["round"] if rounds else 0,
                     "rounds": cfg.pbt.rounds if cfg is not None else None}
        if rounds:
            values = [(m["value"], m["id"]) for m in rounds[-1]["members"] if m.get("value") is not None]
            if values:
                metric = rounds[-1]["members"][0]["metric"]
                value, member = (max if higher_is_better(metric) else min)(values)
                out.update(best=member, value=value, metric=metric,
                           copies=sum(1 for e in rounds for m in e["members"] if m.get("copied_from")))
        return out

    def status_lines(self, section: dict) -> list[str]:
        p = section
        return [f"population: round {p['round']} of {p['rounds'] or '?'} done"
                + (f", best {p['best']} val {p['metric']} {p['value']:.4f} (its round's score), {p['copies']} "
                   f"cop{'y' if p['copies'] == 1 else 'ies'} so far"
                   if "best" in p else "")]
