"""mode = "evolve": the master's side of the architecture search.

Wraps an ``evolve`` ask/tell strategy as the scheduler's spec source: every time a
worker is free the strategy breeds the next genome (steady-state, asynchronous), the
genome becomes a member spec, and its validation metric goes back as fitness. At the
end it writes ``search.csv`` (the run's report plots it); the ensemble is then selected from
everything the search trained, with no extra training.

Resume: each candidate's genome is journalled as it is handed out (an ``issued`` line:
id, evaluation, seed, genome, and how many results the strategy had been told). On
``--resume`` those lines and the finished records, replayed in journal order, rebuild the
strategy exactly as it was (``Strategy.replay``), and the candidates that were out when the
job stopped go out again first, with the same id, genome and seed, before anything new is
bred. With the same results told in the same order (one worker), the resumed search is
the uninterrupted one.

Starting points (``initial_genomes``): the first population begins with an earlier search's
best genomes (``evolve.start_from``, ``sources.earlier``) and the known-good templates for
the input's kind (``evolve.templates``), each asked once, then random genomes. They are read
afresh on ``--resume`` and the strategy skips those already handed out.

Screening (``evolve.surrogate = "forest"``): the strategy breeds several children per child
it sends and a fitness model picks one (``evolve.surrogate``); on ``--resume`` the replayed
results refit it as it was.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any

import numpy as np

from ensemble.config import ConfigError, RunConfig
from ensemble.config.vocabulary import PROPER_SCORES
from ensemble.results.events import Event, EventKind
from ensemble.results.records import SEARCH, MemberRecord, search_entry, searched_seconds
from ensemble.results.rundir import RunDirectory
from ensemble.results.selection import rank_members
from ensemble.sources.base import Hooks
from ensemble.sources.members import derive_seed
from ensemble.task import get_task
from ensemble.task.metrics import higher_is_better, metric_task, metric_text

log = logging.getLogger(__name__)


def _genome_key(genome: dict) -> str:
    from evolve import genome_from_dict
    return genome_from_dict(genome).key()


def search_space(cfg: RunConfig, meta: dict):
    """The validated search space for this data; errors name the `search.*` key."""
    from evolve import SearchSpace, SpaceError
    try:
        return SearchSpace.from_config(dict(cfg.search), input_rank=len(meta["input_shape"]))
    except SpaceError as exc:
        raise ConfigError(*exc.problems) from None


def check_search(cfg: RunConfig, meta: dict) -> None:
    """Rank 0, before any training: the space must fit the data and yield a buildable genome."""
    from evolve import random_genome
    space = search_space(cfg, meta)
    rng = np.random.default_rng(cfg.seed)
    try:                    # a space that rarely yields a valid genome would stall the search later
        for _ in range(20):
            random_genome(rng, space, tuple(meta["input_shape"]), meta["n_outputs"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


#: the first population of a strategy that declares none (random search), for ``evolve.start_from``
FIRST_POPULATION = 12


def initial_genomes(cfg: RunConfig, meta: dict, space, first_population: int | None,
                    earlier: bool = True, run_dir: RunDirectory | None = None) -> tuple[list, frozenset[str]]:
    """The search's starting points, its first asks: an earlier run's best genomes
    (``evolve.start_from``, up to half the first population; not with ``earlier=False``),
    then the templates for the input's kind (``evolve.templates``) the earlier run did not
    train; distinct, at most the first population. And the keys of the genomes the earlier
    run trained but for those starting points: the search asks none of them (with the same
    seed it would draw the same first population again and train it to the same results).
    What the earlier run gave is kept in ``run_dir`` (``sources.earlier.kept``) and read
    from there on ``--resume``. Raises ``ConfigError`` for a bad ``start_from``."""
    from evolve import genome_from_dict, templates
    size = first_population or FIRST_POPULATION
    shape, n_outputs = tuple(meta["input_shape"]), meta["n_outputs"]
    out: list = []
    known: frozenset[str] = frozenset()
    origins: list = []
    if cfg.evolve.start_from and earlier:
        from ensemble.sources.earlier import kept, start_genomes, trained_keys

        def read() -> dict:
            found: list = []
            picked = start_genomes(cfg.evolve.start_from, meta, space, max(1, size // 2), found)
            return {"genomes": [g.to_dict() for g in picked], "origins": found,
                    "trained": sorted(trained_keys(cfg.evolve.start_from, meta))}

        taken = kept(run_dir, "evolve.start_from", cfg.evolve.start_from, read) if run_dir is not None else read()
        out += [genome_from_dict(g) for g in taken["genomes"]]
        origins += taken["origins"]
        known = frozenset(taken["trained"])
    if cfg.evolve.templates:
        keys = {g.key() for g in out} | known
        out += [g for g in templates(space, shape, n_outputs, meta["task"]) if g.key() not in keys]
    out = out[:size]
    if out:
        n = len(origins)
        log.info("search: the first population starts from "
                 + ", ".join(part for part in (
                     f"{n} genome(s) of {cfg.evolve.start_from} (`evolve.start_from`: its {', '.join(origins)}, "
                     f"here e0001{f'-e{n:04d}' if n > 1 else ''})" if n else "",
                     f"{len(out) - n} template(s) (`evolve.templates`)" if len(out) > n else "") if part)
                 + (", then random genomes" if size > len(out) else ""))
    return out, known - {g.key() for g in out}


def first_population(cfg: RunConfig) -> int | None:
    """How many genomes the strategy's first population holds (None: it has none, random
    search). Raises ValueError for settings the strategy refuses."""
    from evolve import STRATEGIES
    cls = STRATEGIES[cfg.evolve.strategy]
    return cls.initial_size(cls.validate_params(dict(cfg.evolve.settings)))


def _fitness(record: MemberRecord, metric: str) -> float | None:
    """What the strategy maximises: the validation metric of a member with one (a discarded
    candidate's at low fidelity), signed so that higher is better; else None."""
    if not record.status.evaluated:
        return None
    value = record.val.get(metric)
    if value is None or not math.isfinite(value):
        return None
    return float(value) if higher_is_better(metric) else -float(value)


def _objectives(record: MemberRecord, metric: str, second: str) -> tuple[float, float] | None:
    """A result's objectives, all maximised: (fitness, -parameters or -inference time)."""
    fit = _fitness(record, metric)
    if fit is None:
        return None
    value = record.params if second == "metric_params" else record.extra.get("predict_seconds_per_sample", 0.0)
    return (fit, -float(value or 0))


def pareto_objectives(cfg: RunConfig, meta: dict):
    """record -> objectives for a multi-objective strategy (whose Pareto front keeps its
    models), else None."""
    from evolve import STRATEGIES
    cls = STRATEGIES[cfg.evolve.strategy]
    if "objectives" not in cls.SETTINGS:
        return None
    metric = get_task(meta["task"]).default_metric(cfg.ensemble.metric)
    second = cfg.evolve.settings["objectives"]
    return lambda record: _objectives(record, metric, second)


class SearchSource:
    """The Source of mode "evolve": strategy.ask() -> spec, record -> strategy.tell().

    ``history`` is the journal of the run so far, in order (member records and events;
    empty for a new run). Each new candidate's ``issued`` event is journalled as it is
    handed out (``Hooks.event``), so a resume re-issues it."""

    def __init__(self, cfg: RunConfig, meta: dict, run_dir: RunDirectory, history: list[MemberRecord | Event],
                 lost: set[str] = frozenset(), workers: int = 1):
        from evolve import STRATEGIES, make_strategy
        ev = cfg.evolve
        self.cfg, self.meta, self.run_dir = cfg, meta, run_dir
        self.metric = get_task(meta["task"]).default_metric(cfg.ensemble.metric)
        self.space = search_space(cfg, meta)
        self.input_shape = tuple(meta["input_shape"])
        cls = STRATEGIES[ev.strategy]
        params = dict(ev.settings)                    # as the strategy declares them, defaults filled in
        self.objectives = params.get("objectives", "metric_params")
        first = first_population(cfg)
        try:
            self.initial, known = initial_genomes(cfg, meta, self.space, first, run_dir=run_dir)
        except ConfigError as exc:
            if not history:                       # a new search: the user's mistake, said before anything runs
                raise
            log.warning(f"resume: {exc}; the search goes on without the starting points it had not handed out")
            self.initial, known = initial_genomes(cfg, meta, self.space, first, earlier=False)
        from evolve.screening import Ahead, ahead_children
        surrogate = self._surrogate()
        ahead = ahead_children(ev.surrogate_ahead, workers) if surrogate is not None and surrogate.candidates > 1 else 0
        self.strategy = make_strategy(ev.strategy, self.space, self.input_shape, meta["n_outputs"],
                                      rng_seed=cfg.seed, budget_evaluations=ev.evaluations,
                                      budget_seconds=ev.time_limit, initial=self.initial,
                                      surrogate=None if ahead else surrogate, compact_start=ev.compact_start,
                                      known=known, **params)
        if ahead:                                 # before the replay: the helper's twin sees the whole history
            self.strategy.attach(Ahead(self.strategy, surrogate, ahead, ev.surrogate_helpers))
            log.info(f"search: bred children screened ahead by {ev.surrogate_helpers} helper process(es) "
                     f"({ahead} kept ready, `evolve.surrogate_ahead`)")
        self.total = ev.evaluations
        self.population_size = cls.initial_size(self.strategy.params)
        self.hooks: Hooks | None = None
        self.genomes: dict[str, object] = {}
        self.reissue: deque[dict] = deque()       # issued lines of candidates out when the run stopped
        done = self._replay(history)
        # the next candidate's number: after every one issued or finished (a given-up one included)
        self.count = max([int(x.data.get("evaluation", 0)) for x in history
                          if isinstance(x, Event) and x.kind is EventKind.ISSUED]
                         + [r.extra[SEARCH]["evaluation"] for r in done if SEARCH in r.extra], default=0)
        self.wall0 = time.monotonic() - searched_seconds(done)
        self.strategy.continue_clock(searched_seconds(done))     # `evolve.time_limit` counts over the jobs
        self.exhausted = False
        # finished candidates whose kept artifacts were lost: the same genome, id and seed again
        latest = {r.id: r for r in done}
        self.retrain = [latest[i] for i in sorted(lost) if i in latest]
        self.retraining: set[str] = set()
        self.inherit = ev.inherit
        self.ids_by_key = {_genome_key(r.genome): r.id for r in done if r.status.ranked}

    def _surrogate(self):
        """``evolve.surrogate``: the fitness model that screens bred children, or None."""
        ev = self.cfg.evolve
        if ev.surrogate == "off":
            return None
        from evolve.surrogate import Surrogate
        return Surrogate(self.space, self.input_shape, self.meta["n_outputs"], candidates=ev.surrogate_candidates,
                         min_results=ev.surrogate_min_results, seed=self.cfg.seed)

    def bind(self, hooks: Hooks) -> None:
        self.hooks = hooks

    def _parent(self, genome) -> dict | None:
        """``evolve.inherit``: the trained parent a bred child starts from (its id and model
        file), when the strategy bred it by mutation and the parent's model is kept."""
        if not self.inherit:
            return None
        parent = self.strategy.parent_of(genome)
        parent_id = self.ids_by_key.get(parent.key()) if parent is not None else None
        if parent_id is None or not self.run_dir.model_path(parent_id).is_file():
            return None
        return {"from": parent_id, "path": str(self.run_dir.model_path(parent_id))}

    def _replay(self, history: list[MemberRecord | Event]) -> list[MemberRecord]:
        """Tell the strategy the journal's asks and results in their order; queue the
        candidates issued but not finished for ``next_spec``. Returns the finished records."""
        from evolve import genome_from_dict
        events: list[dict] = []
        done: list[MemberRecord] = []
        issued: dict[str, Any] = {}
        told: set[str] = set()
        for item in history:
            if isinstance(item, Event):
                x = item.data
                if item.kind is EventKind.ISSUED and x["id"] not in issued and x["id"] not in told:
                    if x.get("told", len(told)) != len(told):
                        log.warning(f"resume: {x['id']} was bred after {x['told']} results, but the journal "
                                    f"before it has {len(told)}; the search may take another path than it did")
                    issued[x["id"]] = x
                    events.append({"event": "ask", "genome": x["genome"]})
            elif item.genome is not None:
                done.append(item)
                if item.id in told:          # a member trained again (lost artifacts): told once, as it was
                    continue
                told.add(item.id)
                events.append({"genome": item.genome, "fitness": _fitness(item, self.metric),
                               "objectives": self._objectives(item), "asked": item.id in issued})
        self.strategy.replay(events)
        for spec_id, line in issued.items():
            if spec_id not in told:
                self.genomes[spec_id] = genome_from_dict(line["genome"])
                self.reissue.append(line)
        if self.reissue:
            log.info(f"resume: {len(self.reissue)} candidate(s) out when the run stopped go out again as they "
                     f"were: {', '.join(x['id'] for x in list(self.reissue)[:10])}"
                     + (" ..." if len(self.reissue) > 10 else ""))
        return done

    def _objectives(self, r: MemberRecord) -> tuple[float, float] | None:
        return _objectives(r, self.metric, self.objectives)

    def next_spec(self) -> dict | None:
        if self.reissue:                    # out when the last run stopped: again, as it was
            line = self.reissue.popleft()
            return self._spec(line["id"], self.genomes[line["id"]], line["evaluation"], line.get("seed"),
                              line.get("inherit"))
        if self.retrain:
            from evolve import genome_from_dict
            record = self.retrain.pop()
            self.retraining.add(record.id)
            return self._spec(record.id, genome_from_dict(record.genome), int(record.id[1:]))
        if self.exhausted:
            return None
        try:
            genome = self.strategy.ask()
        except ValueError as exc:          # the space stopped yielding valid genomes: end the search
            log.warning("search stopped: %s", exc)
            self.exhausted = True
            return None
        if genome is None:
            return None
        self.count += 1
        spec_id = f"e{self.count:04d}"
        self.genomes[spec_id] = genome
        spec = self._spec(spec_id, genome, self.count, inherit=self._parent(genome))
        if self.hooks is not None:
            line = {"event": EventKind.ISSUED.value, "id": spec_id, "evaluation": self.count, "seed": spec["seed"],
                    "told": self.strategy.told, "genome": spec["genome"], "time": round(time.time(), 4)}
            if spec.get("inherit"):
                line["inherit"] = spec["inherit"]
            self.hooks.event(line)
        return spec

    def _spec(self, spec_id: str, genome, count: int, seed: int | None = None, inherit: dict | None = None) -> dict:
        from evolve import decode
        extra = {"inherit": inherit} if inherit else {}
        return {"id": spec_id, "arch": "evolved", "model": None, "params": {}, **extra,
                "layers": decode(genome, self.input_shape, self.space, self.meta["n_outputs"]),
                "seed": derive_seed(self.cfg.seed, 1_000_003, count) if seed is None else seed,
                **self.cfg.train.to_dict(),              # the genome evolves the three below
                "optimizer": genome.optimizer, "learning_rate": genome.learning_rate,
                "batch_size": genome.batch_size, "genome": genome.to_dict(),
                "summary": genome.summary(self.input_shape)}

    def dry(self) -> bool:
        return not self.reissue and not self.retrain and (self.exhausted or self.strategy.budget_spent())

    def tell(self, record: MemberRecord) -> MemberRecord:
        """A candidate ended (a discarded one is a low-fidelity evaluation): the strategy
        learns its fitness; the record gets its ``search`` entry (evaluation, wall, fitness)."""
        fitness = _fitness(record, self.metric)
        entry = search_entry(int(record.id[1:]), time.monotonic() - self.wall0, fitness)
        if record.id in self.retraining:                # the strategy was told when it first finished
            self.retraining.discard(record.id)
        else:
            genome = self.genomes.pop(record.id)
            if record.status.ranked:
                self.ids_by_key[genome.key()] = record.id
            self.strategy.tell(genome, fitness, self._objectives(record))
        return record.replace(extra={**record.extra, SEARCH: entry})

    def finish(self, records: list[MemberRecord]) -> dict:
        """Write search.csv (the report draws it); print initial population vs search best."""
        import pandas as pd
        rows = sorted((r for r in records if SEARCH in r.extra), key=lambda r: r.extra[SEARCH]["wall"])
        best, table = -math.inf, []
        sign = 1 if higher_is_better(self.metric) else -1      # fitness is maximised: undo the sign
        for r in rows:
            fit = r.extra[SEARCH]["fitness"]
            if r.status.ranked and fit is not None:            # the best so far counts full evaluations only
                best = max(best, fit)
            table.append({"evaluation": r.extra[SEARCH]["evaluation"], "wall_seconds": r.extra[SEARCH]["wall"],
                          "id": r.id, "status": r.status.value,
                          f"val_{self.metric}": None if fit is None else sign * fit,
                          f"best_val_{self.metric}": None if best == -math.inf else sign * best,
                          "params": r.params, "genome": r.summary,
                          "discarded_at_epoch": (r.discarded or {}).get("epoch")})
        frame = pd.DataFrame(table)
        self.run_dir.write_text(self.run_dir.SEARCH_TABLE, frame.to_csv(index=False))
        out = self.compare(rows)
        self.strategy.close()                            # the screening helper, if any
        st = self.strategy.screening_state()
        if st is not None:                               # its cost, for the summary
            out = {**out, "surrogate": st}
            log.info("search: surrogate " + (
                f"fitted {st['surrogate_fits']} time(s) ({st['surrogate_fit_seconds']:.2f} s), screened "
                f"{st['surrogate_screens']} time(s) ({st['surrogate_screen_seconds']:.2f} s)"
                if st.get("surrogate_fits") else
                "never fitted: the helper sent no screened child before the search ended"
                if "surrogate_results" not in st else
                f"never fitted: {st['surrogate_results']} result(s), fewer than `evolve.surrogate_min_results`")
                + ("" if "surrogate_ahead" not in st else
                   f"; ahead of the loop: {st['surrogate_served']} bred child(ren) screened, "
                   f"{st['surrogate_missed']} went out unscreened (none ready)"
                   + (f" ({st['surrogate_failed']})" if st.get("surrogate_failed") else "")))
        return {"search": out}

    def compare(self, rows: list[MemberRecord]) -> dict:
        """Best of the initial population (its starting points and random genomes) against the
        best the search found."""
        ok = [r for r in rows if r.extra[SEARCH]["fitness"] is not None and r.status.ranked]
        if self.population_size is None:          # random search: no initial population to beat
            return {}
        initial = [r for r in ok if r.extra[SEARCH]["evaluation"] <= self.population_size]
        if not ok or not initial:
            return {}

        def pick(rs: list[MemberRecord]) -> MemberRecord:     # as the leaderboard ranks: ties by the proper score
            return rank_members(rs, self.metric, PROPER_SCORES[metric_task(self.metric)])[0]
        a, b = pick(initial), pick(ok)
        out = {"metric": self.metric, "initial_best": {"id": a.id, "val": a.val[self.metric],
                                                      "test": a.test[self.metric], "genome": a.summary},
               "search_best": {"id": b.id, "val": b.val[self.metric],
                               "test": b.test[self.metric], "genome": b.summary},
               "evaluations": len(rows), "initial_population": self.population_size}
        first = min(self.population_size, len(rows))
        bred = len(rows) > self.population_size
        if not bred:
            ev = self.cfg.evolve
            if ev.evaluations and ev.evaluations <= self.population_size:
                fix = "raise `evolve.evaluations` above the first population"
            elif ev.time_limit and self.strategy.budget_spent():
                fix = (f"`evolve.time_limit` ({ev.time_limit:g} s) ended it first: raise it, or `--resume` "
                       "goes on breeding")
            else:                                  # a run's time limit, failures, a stop: said above
                fix = "the run ended before the search's budget (said above); `--resume` goes on breeding"
            how = (f"the search ended within its first population ({len(rows)} of {self.population_size}): "
                   f"nothing was bred; {fix}")
        elif b.extra["search"]["evaluation"] <= self.population_size:
            how = f"best after {len(rows)} evaluations, from the first population (nothing bred beat it)"
        else:
            how = f"best evolved after {len(rows)} evaluations"
        log.info(f"search: best of the first population ({first}) {a.id}: "
                 f"val {self.metric} {metric_text(out['initial_best']['val'])}, test "
                 f"{metric_text(out['initial_best']['test'])}\n"
                 f"search: {how}   {b.id}: val {self.metric} {metric_text(out['search_best']['val'])}, test "
                 f"{metric_text(out['search_best']['test'])}  [{b.summary}]")
        return out
