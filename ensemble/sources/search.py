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
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ensemble.config import ConfigError
from ensemble.results.rundir import RunDirectory
from ensemble.sources.members import derive_seed
from ensemble.task import get_task
from ensemble.task.metrics import higher_is_better

log = logging.getLogger(__name__)


def _genome_key(genome: dict) -> str:
    from evolve import Genome
    return Genome.from_dict(genome).key()


def search_space(cfg: dict, meta: dict):
    """The validated search space for this data; errors name the `search.*` key."""
    from evolve import SearchSpace
    try:
        return SearchSpace.from_config(cfg["search"], input_rank=len(meta["input_shape"]))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_search(cfg: dict, meta: dict) -> None:
    """Rank 0, before any training: the space must fit the data and yield a buildable genome."""
    from evolve import random_genome
    space = search_space(cfg, meta)
    rng = np.random.default_rng(cfg["seed"])
    try:                    # a space that rarely yields a valid genome would stall the search later
        for _ in range(20):
            random_genome(rng, space, tuple(meta["input_shape"]), meta["n_outputs"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _fitness(record: dict, metric: str) -> float | None:
    if record.get("status") != "ok":
        return None
    value = record["val"].get(metric)
    if value is None or not math.isfinite(value):
        return None
    return float(value) if higher_is_better(metric) else -float(value)


def _objectives(record: dict, metric: str, second: str) -> tuple[float, float] | None:
    """A result's objectives, all maximised: (fitness, -parameters or -inference time)."""
    fit = _fitness(record, metric)
    if fit is None:
        return None
    value = record.get("params", 0) if second == "metric_params" else record.get("predict_seconds_per_sample", 0.0)
    return (fit, -float(value or 0))


def pareto_objectives(cfg: dict, meta: dict):
    """record -> objectives for a multi-objective strategy (whose Pareto front keeps its
    models), else None."""
    from evolve import STRATEGIES
    ev = cfg["evolve"]
    cls = STRATEGIES[ev["strategy"]]
    if "objectives" not in cls.SETTINGS:
        return None
    metric = get_task(meta["task"]).default_metric(cfg["ensemble"]["metric"])
    second = ev.get("objectives", cls.SETTINGS["objectives"].default)
    return lambda record: _objectives(record, metric, second)


class SearchSource:
    """Spec source for the scheduler: strategy.ask() -> spec, result -> strategy.tell().

    ``lines`` are the journal's lines of the run so far, in order (member records and event
    lines; empty for a new run). Set ``on_issue`` to receive each new candidate's ``issued``
    line as it is handed out (the master journals it)."""

    def __init__(self, cfg: dict, meta: dict, run_dir: RunDirectory, lines: list[dict],
                 lost: set[str] = frozenset()):
        from evolve import STRATEGIES, make_strategy
        ev = cfg["evolve"]
        self.cfg, self.meta, self.run_dir = cfg, meta, run_dir
        self.metric = get_task(meta["task"]).default_metric(cfg["ensemble"]["metric"])
        self.space = search_space(cfg, meta)
        self.input_shape = tuple(meta["input_shape"])
        cls = STRATEGIES[ev["strategy"]]
        params = {k: ev.get(k, s.default) for k, s in cls.SETTINGS.items()}   # as the strategy declares
        self.objectives = params.get("objectives", "metric_params")
        self.strategy = make_strategy(ev["strategy"], self.space, self.input_shape, meta["n_outputs"],
                                      rng_seed=cfg["seed"], budget_evaluations=ev["evaluations"],
                                      budget_seconds=ev["time_limit"], **params)
        self.total = ev["evaluations"]
        self.population_size = cls.initial_size(self.strategy.params)
        self.on_issue: Callable[[dict], None] | None = None
        self.genomes: dict[str, object] = {}
        self.reissue: deque[dict] = deque()       # issued lines of candidates out when the run stopped
        done = self._replay(lines)
        self.count = max([r["search"]["evaluation"] for r in done if "search" in r]
                         + [x["evaluation"] for x in self.reissue], default=0)
        self.wall0 = time.monotonic() - max([r["search"]["wall"] for r in done if "search" in r], default=0.0)
        self.exhausted = False
        # finished candidates whose kept artifacts were lost: the same genome, id and seed again
        latest = {r["id"]: r for r in done}
        self.retrain = [latest[i] for i in sorted(lost) if i in latest]
        self.retraining: set[str] = set()
        self.inherit = bool(ev.get("inherit", False))
        self.discard = None                           # ``sources.discard.EarlyDiscard``, set by the session
        self.ids_by_key = {_genome_key(r["genome"]): r["id"] for r in done
                           if r.get("status") == "ok" and not r.get("discarded")}

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

    def _replay(self, lines: list[dict]) -> list[dict]:
        """Tell the strategy the journal's asks and results in their order; queue the
        candidates issued but not finished for ``next_spec``. Returns the finished records."""
        from evolve import Genome
        events, done, issued, told = [], [], {}, set()
        for x in lines:
            kind = x.get("event")
            if kind == "issued" and x["id"] not in issued and x["id"] not in told:
                if x.get("told", len(told)) != len(told):
                    log.warning(f"resume: {x['id']} was bred after {x['told']} results, but the journal "
                                f"before it has {len(told)}; the search may take another path than it did")
                issued[x["id"]] = x
                events.append({"event": "ask", "genome": x["genome"]})
            elif kind is None and "genome" in x:
                done.append(x)
                if x["id"] in told:          # a member trained again (lost artifacts): told once, as it was
                    continue
                told.add(x["id"])
                events.append({"genome": x["genome"], "fitness": _fitness(x, self.metric),
                               "objectives": self._objectives(x), "asked": x["id"] in issued})
        self.strategy.replay(events)
        for spec_id, line in issued.items():
            if spec_id not in told:
                self.genomes[spec_id] = Genome.from_dict(line["genome"])
                self.reissue.append(line)
        if self.reissue:
            log.info(f"resume: {len(self.reissue)} candidate(s) out when the run stopped go out again as they "
                     f"were: {', '.join(x['id'] for x in list(self.reissue)[:10])}"
                     + (" ..." if len(self.reissue) > 10 else ""))
        return done

    def _objectives(self, r: dict) -> tuple[float, float] | None:
        return _objectives(r, self.metric, self.objectives)

    def next_spec(self) -> dict | None:
        if self.reissue:                    # out when the last run stopped: again, as it was
            line = self.reissue.popleft()
            return self._spec(line["id"], self.genomes[line["id"]], line["evaluation"], line.get("seed"),
                              line.get("inherit"))
        if self.retrain:
            from evolve import Genome
            record = self.retrain.pop()
            self.retraining.add(record["id"])
            return self._spec(record["id"], Genome.from_dict(record["genome"]), int(record["id"][1:]))
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
        if self.on_issue is not None:
            line = {"event": "issued", "id": spec_id, "evaluation": self.count, "seed": spec["seed"],
                    "told": self.strategy.told, "genome": spec["genome"], "time": round(time.time(), 4)}
            if spec.get("inherit"):
                line["inherit"] = spec["inherit"]
            self.on_issue(line)
        return spec

    def _spec(self, spec_id: str, genome, count: int, seed: int | None = None, inherit: dict | None = None) -> dict:
        from evolve import decode
        extra = {"inherit": inherit} if inherit else {}
        return {"id": spec_id, "arch": "evolved", "model": None, "params": {}, **extra,
                "layers": decode(genome, self.input_shape, self.space, self.meta["n_outputs"]),
                "seed": derive_seed(self.cfg["seed"], 1_000_003, count) if seed is None else seed,
                **self.cfg["train"],                     # the genome evolves the three below
                "optimizer": genome.optimizer, "learning_rate": genome.learning_rate,
                "batch_size": genome.batch_size, "genome": genome.to_dict(),
                "summary": genome.summary(self.input_shape)}

    def tell(self, result: dict) -> None:
        if self.discard is not None:                    # stopped early: a low-fidelity evaluation
            self.discard.mark(result)
        if result["id"] in self.retraining:             # the strategy was told when it first finished
            self.retraining.discard(result["id"])
            result["search"] = {"evaluation": int(result["id"][1:]),
                                "wall": round(time.monotonic() - self.wall0, 3), "fitness": _fitness(result, self.metric)}
            return
        genome = self.genomes.pop(result["id"])
        fitness = _fitness(result, self.metric)
        if result.get("status") == "ok" and not result.get("discarded"):
            self.ids_by_key[genome.key()] = result["id"]
        self.strategy.tell(genome, fitness, self._objectives(result))
        result["search"] = {"evaluation": int(result["id"][1:]), "wall": round(time.monotonic() - self.wall0, 3),
                            "fitness": fitness}

    def finish(self, records: list[dict]) -> dict:
        """Write search.csv (the report draws it); print initial population vs search best."""
        import pandas as pd
        rows = sorted((r for r in records if "search" in r), key=lambda r: r["search"]["wall"])
        best, table = -math.inf, []
        sign = 1 if higher_is_better(self.metric) else -1      # fitness is maximised: undo the sign
        for r in rows:
            fit = r["search"]["fitness"]
            best = max(best, fit) if fit is not None else best
            table.append({"evaluation": r["search"]["evaluation"], "wall_seconds": r["search"]["wall"],
                          "id": r["id"], "status": r["status"],
                          f"val_{self.metric}": None if fit is None else sign * fit,
                          f"best_val_{self.metric}": None if best == -math.inf else sign * best,
                          "params": r.get("params"), "genome": r.get("summary"),
                          "discarded_at_epoch": (r.get("discarded") or {}).get("epoch")})
        frame = pd.DataFrame(table)
        self.run_dir.write_text(self.run_dir.SEARCH_TABLE, frame.to_csv(index=False))
        return self.compare(rows)

    def compare(self, rows: list[dict]) -> dict:
        """Best of the initial random population against the best the search found."""
        ok = [r for r in rows if r["search"]["fitness"] is not None and not r.get("discarded")]
        if self.population_size is None:          # random search: no initial population to beat
            return {}
        initial = [r for r in ok if r["search"]["evaluation"] <= self.population_size]
        if not ok or not initial:
            return {}
        pick = lambda rs: max(rs, key=lambda r: (r["search"]["fitness"], -r["search"]["evaluation"]))  # noqa: E731
        a, b = pick(initial), pick(ok)
        out = {"metric": self.metric, "initial_best": {"id": a["id"], "val": a["val"][self.metric],
                                                      "test": a["test"][self.metric], "genome": a.get("summary")},
               "search_best": {"id": b["id"], "val": b["val"][self.metric],
                               "test": b["test"][self.metric], "genome": b.get("summary")},
               "evaluations": len(rows), "initial_population": self.population_size}
        log.info(f"search: best of the initial random population ({self.population_size}) {a['id']}: "
                 f"val {self.metric} {out['initial_best']['val']:.4f}, test {out['initial_best']['test']:.4f}\n"
                 f"search: best evolved after {len(rows)} evaluations          {b['id']}: "
                 f"val {self.metric} {out['search_best']['val']:.4f}, test {out['search_best']['test']:.4f}"
                 f"  [{b.get('summary')}]")
        return out
