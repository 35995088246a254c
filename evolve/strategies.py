"""Ask/tell search strategies (optuna-like), MPI-free.

The master calls ``ask()`` for a genome to train and ``tell()`` with its result.
``ask()`` returns None when the budget is spent or, for generational strategies,
while the current generation is still out. ``done()`` is True once the budget is
spent and every asked genome has been told.

Determinism and resume: the strategy's random Generator is derived afresh from
``(rng_seed, tells, asks)`` at every ask, so nothing random carries over from one
ask to the next. The whole state (population, ages, generation, counters, cache,
and with them the next genome) is therefore a pure function of the sequence of
asks (the genomes they gave) and tells, and ``replay(events)`` rebuilds it exactly
from that sequence as a journal holds it, without re-running any ask. Genomes that
were asked but not told when the original stopped stay pending after ``replay``:
the caller hands them out again and tells their results, and the strategy goes on
exactly as the original would have with the same results in the same order.

Starting points: ``initial`` genomes (templates, an earlier run's best) are the first asks
of the first population, each once; the rest of the first population alternates one-step
mutants of them and random genomes (``compact_start``: drawn small, the fewest stages or one
more with one block each, to grow by mutation). Which of them is next is read from what was asked, so
``replay`` skips those already handed out.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Sequence

import numpy as np
from deap import tools

from evolve.decode import count_params
from evolve.operators import Candidate, crossover, mutate, random_genome, tournament
from evolve.space import SearchSpace
from evolve.structured import AnyGenome, genome_from_dict
from evolve.surrogate import Surrogate

if TYPE_CHECKING:
    from evolve.screening import Ahead

MAX_TRIES = 50


@dataclass(frozen=True)
class Setting:
    """One setting a strategy declares: its default, what values it takes, what it does.

    The config's ``[evolve]`` table, the strategy itself and the README's table are all
    made from these declarations, so they cannot disagree.
    """
    default: Any
    doc: str
    choices: tuple | None = None          # allowed strings; else an integer >= 1 or, for
                                          # names ending in ``_prob``, a probability

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (``must be ...``), or None."""
        if self.choices is not None:
            return None if value in self.choices else (
                f"must be one of {', '.join(repr(c) for c in self.choices)}")
        if isinstance(self.default, float):
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= 1
            return None if ok else "must be a probability in [0, 1]"
        ok = not isinstance(value, bool) and isinstance(value, int) and value >= 1
        return None if ok else "must be an integer >= 1"


CROSSOVER = "probability that a child is bred by crossover of two parents (then mutated)"


class Strategy:
    """Shared bookkeeping: budget, fitness cache, best, RNG, replay."""

    name: ClassVar[str] = "base"
    SETTINGS: ClassVar[dict[str, Setting]] = {}

    def __init__(self, space: SearchSpace, input_shape: tuple[int, ...], n_outputs: int,
                 rng_seed: int = 0, budget_evaluations: int | None = None,
                 budget_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic, initial: Sequence[AnyGenome] = (),
                 surrogate: Surrogate | None = None, compact_start: bool = False, known: Iterable[str] = (),
                 **params: Any):
        self.space, self.input_shape, self.n_outputs = space, tuple(input_shape), int(n_outputs)
        self.initial = tuple(initial)
        self.known = frozenset(known) - {g.key() for g in self.initial}    # trained by an earlier run: not again
        self.compact_start = compact_start
        self.surrogate = surrogate
        self.ahead: Ahead | None = None          # children screened ahead in a helper process (``attach``)
        self.seed = int(rng_seed) % 2 ** 63
        self.budget_evaluations, self.budget_seconds = budget_evaluations, budget_seconds
        self.params = self.validate_params(params)
        self._clock, self._t0 = clock, clock()
        self.asked = self.told = self.failed = 0
        self.results: dict[str, float | None] = {}  # fitness cache by genome key
        self._seen: set[str] = set(self.known)    # never asked again (the starting points are asked)
        self._pending: dict[str, AnyGenome] = {}
        self._bred_from: dict[str, AnyGenome] = {}        # child key -> the parent it was bred from
        self.best: tuple[AnyGenome, float] | None = None
        self.rng = self._derive_rng()

    # -- parameters ---------------------------------------------------------
    @classmethod
    def validate_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in; ValueError naming the parameter on unknown or bad values."""
        params = dict(params)
        if "lambda" in params and "lambda_" in cls.SETTINGS:
            params["lambda_"] = params.pop("lambda")
        unknown = sorted(set(params) - set(cls.SETTINGS))
        if unknown:
            raise ValueError(f"strategy '{cls.name}' has no parameter `{unknown[0]}`; "
                             f"allowed: {sorted(cls.SETTINGS) or 'none'}")
        out = {**cls.defaults(), **params}
        for key, v in out.items():
            why = cls.SETTINGS[key].problem(v)
            if why:
                raise ValueError(f"strategy '{cls.name}' parameter `{key}` {why}, but got {v!r}")
        return out

    @classmethod
    def initial_size(cls, params: dict[str, Any]) -> int | None:
        """How many genomes of the first population are random (None: all of them)."""
        return params.get("population_size")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every setting of this strategy with its default."""
        return {k: s.default for k, s in cls.SETTINGS.items()}

    # -- the ask/tell contract ----------------------------------------------
    def budget_spent(self) -> bool:
        """No more asks will be issued."""
        if self.budget_evaluations is not None and self.asked >= self.budget_evaluations:
            return True
        return self.budget_seconds is not None and self.elapsed() >= self.budget_seconds

    def done(self) -> bool:
        """Budget spent and every asked genome told."""
        return self.budget_spent() and not self._pending

    def ask(self) -> AnyGenome | None:
        """Next genome to evaluate; None if the budget is spent or results must come first."""
        if self.budget_spent():
            return None
        self.rng = self._derive_rng()
        g = self._propose()
        if g is not None:
            self._register(g)
        return g

    def tell(self, genome: AnyGenome, fitness: float | None,
             objectives: tuple[float, ...] | None = None) -> None:
        """Result of an evaluation; fitness is maximised, None (or NaN) means it failed."""
        if fitness is not None:
            fitness = float(fitness)
            if not math.isfinite(fitness):
                fitness = None
        key = genome.key()
        self._pending.pop(key, None)
        self._seen.add(key)
        self.told += 1
        self.results[key] = fitness
        if self.surrogate is not None:
            self.surrogate.observe(genome, fitness)
        if self.ahead is not None:
            self.ahead.note_tell(genome, fitness, objectives)
        if fitness is None:
            self.failed += 1
        elif self.best is None or fitness > self.best[1]:
            self.best = (genome, fitness)
        self._observe(genome, fitness, None if objectives is None else tuple(objectives))

    def replay(self, events: list[dict]) -> None:
        """Rebuild the state from the journal's asks and tells, in their order, without
        re-running any ask.

        ``{"event": "ask", "genome"}``: a genome that was handed out. ``{"genome",
        "fitness", "objectives"}``: its result; ``"asked": True`` says its ask is among the
        events before, else (journals that kept no asks) it is registered as asked first.
        Asks without a result stay pending: hand them out again and ``tell`` their results.
        """
        for n, rec in enumerate(events):
            try:
                g = genome_from_dict(rec["genome"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"journal record {n}: cannot read its genome ({e})") from e
            if rec.get("event") == "ask":
                self._register(g)
                continue
            if not rec.get("asked"):
                self._register(g)
            self.tell(g, rec.get("fitness"), rec.get("objectives"))

    def elapsed(self) -> float:
        return self._clock() - self._t0

    def continue_clock(self, elapsed: float) -> None:
        """A resumed search's clock goes on from the ``elapsed`` seconds its earlier jobs searched:
        ``budget_seconds`` counts over the jobs, as ``budget_evaluations`` does (it began at 0 again)."""
        self._t0 = self._clock() - float(elapsed)

    def state(self) -> dict:
        """Small JSON-able summary for logs."""
        out = {"strategy": self.name, "asked": self.asked, "told": self.told,
               "failed": self.failed, "pending": len(self._pending),
               "elapsed_s": round(self.elapsed(), 3), "budget_spent": self.budget_spent(),
               "best_fitness": self.best[1] if self.best else None,
               "best": self.best[0].summary(self.input_shape) if self.best else None,
               "best_key": self.best[0].key() if self.best else None}
        out.update(self._extra_state())
        screening = self.screening_state()
        if screening is not None:
            out.update(screening)
        return out

    def screening_state(self) -> dict | None:
        """The surrogate's counts (``Surrogate.state``; with ``attach``, the helper's and how
        many asks it served), or None without a surrogate."""
        if self.ahead is not None:
            return self.ahead.state()
        return self.surrogate.state() if self.surrogate is not None else None

    def attach(self, ahead: Ahead) -> None:
        """Screen bred children ahead, off the caller's loop (``evolve.screening``): from now
        on every ask and tell is also sent to ``ahead``'s twin of this strategy, and a bred
        child is the next one it screened (a plain bred child when none is ready). Attach
        before ``replay``, so the twin sees the whole history. The search is then no longer
        a function of its seed and results alone: which children are ready depends on time."""
        self.ahead = ahead

    def close(self) -> None:
        """Stop the helper of ``attach`` (if any)."""
        if self.ahead is not None:
            self.ahead.close()

    # -- helpers and hooks --------------------------------------------------
    def _derive_rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.told, self.asked])

    def _register(self, g: AnyGenome) -> None:
        self.asked += 1
        key = g.key()
        self._seen.add(key)
        self._pending[key] = g
        self._on_ask(g)
        if self.ahead is not None:
            self.ahead.note_ask(g)

    def _random(self, compact: bool = False) -> AnyGenome:
        return random_genome(self.rng, self.space, self.input_shape, self.n_outputs, compact)

    def _initial_genome(self) -> AnyGenome:
        """A genome of the first population: the next starting point not yet asked; after them,
        by turns a one-step mutant of a starting point (round robin) and a random genome, so
        half the rest of the first population lies near a known-good network and half spreads
        over the space."""
        for g in self.initial:
            if g.key() not in self._seen:
                return g
        if self.initial and self.asked % 2 == 0:
            start = self.initial[(self.asked // 2) % len(self.initial)]
            # not ``_mutate``: a starting point may still be training, so no parent is noted to inherit from
            return mutate(start, self.rng, self.space, self.input_shape, self.n_outputs)
        return self._random(self.compact_start)

    def _mutate(self, g: AnyGenome) -> AnyGenome:
        child = mutate(g, self.rng, self.space, self.input_shape, self.n_outputs)
        self._note_parent(child, self._bred_from.get(g.key(), g))   # a crossover child: its first parent
        return child

    def _crossover(self, a: AnyGenome, b: AnyGenome) -> AnyGenome:
        child = crossover(a, b, self.rng, self.space, self.input_shape, self.n_outputs)[0]
        self._note_parent(child, a)
        return child

    def _note_parent(self, child: AnyGenome, parent: AnyGenome) -> None:
        """Remember which evaluated genome ``child`` was bred from (weight inheritance reads
        it through ``parent_of``); bounded: only the latest breedings are kept."""
        self._bred_from[child.key()] = parent
        if len(self._bred_from) > 4096:
            self._bred_from.pop(next(iter(self._bred_from)))

    def parent_of(self, child: AnyGenome) -> AnyGenome | None:
        """The evaluated genome ``child`` was bred from by mutation (the first parent of a
        crossover); None for a random genome."""
        return self._bred_from.get(child.key())

    def _fresh(self, propose: Callable[[], AnyGenome]) -> AnyGenome:
        """A genome never asked before: retry ``propose``, then random; a duplicate at worst."""
        g = None
        for make in (propose, self._random):
            for _ in range(MAX_TRIES):
                g = make()
                if g.key() not in self._seen:
                    return g
        return g

    def _breed(self, propose: Callable[[], AnyGenome]) -> AnyGenome:
        """A bred child to train: ``_fresh(propose)``; with a surrogate that has seen enough
        results, the most promising (``Surrogate.choose``) of ``candidates`` children bred by
        ``propose``, each new (never asked or trained), distinct; with ``attach``, the next
        child the helper screened that is still new and of the current ``lineage``."""
        if self.ahead is not None:
            ready = self.ahead.take(self._seen, self.lineage())
            if ready is not None:
                child, parent = ready
                if parent is not None:
                    self._note_parent(child, parent)
                return child
            return self._fresh(propose)
        s = self.surrogate
        if s is None or s.candidates < 2 or not s.ready:
            return self._fresh(propose)
        children = self.new_children(propose, s.candidates, s.trained.__contains__)
        if not children:
            return self._fresh(propose)
        return children[s.choose(children)]

    def new_children(self, propose: Callable[[], AnyGenome], want: int,
                     known: Callable[[str], bool]) -> list[AnyGenome]:
        """Up to ``want`` distinct children bred by ``propose``, none asked before nor ``known``
        (by key: trained, offered); at most ``3 x want`` tries, so a crowded space yields fewer.
        What a surrogate screens, in the loop (``_breed``) or ahead (``evolve.screening``)."""
        pool: dict[str, AnyGenome] = {}
        for _ in range(want * 3):
            g = propose()
            key = g.key()
            if key not in self._seen and not known(key):
                pool.setdefault(key, g)
                if len(pool) == want:
                    break
        return list(pool.values())

    def _propose(self) -> AnyGenome | None:
        raise NotImplementedError

    def breeder(self) -> Callable[[], AnyGenome] | None:
        """What breeds this strategy's next child now (``_breed``'s ``propose``), or None while
        its asks are not bred (a first population, random search): what a twin that screens
        ahead (``evolve.screening``) breeds with."""
        return None

    def lineage(self) -> int:
        """Changes when children bred before are no longer this strategy's to ask (a
        generation's parents replaced); a child screened ahead under another is dropped."""
        return 0

    def _on_ask(self, g: AnyGenome) -> None:
        pass

    def _observe(self, g: AnyGenome, fitness: float | None, objectives: tuple | None) -> None:
        pass

    def _extra_state(self) -> dict:
        return {}


class RandomSearch(Strategy):
    """Baseline: independent random genomes."""

    name = "random"

    def _propose(self) -> AnyGenome:
        return self._fresh(self._initial_genome)


class RegularizedEvolution(Strategy):
    """Aging evolution (Real et al. 2019), steady-state and fully asynchronous.

    Random genomes until ``population_size`` results are in; then each ask
    mutates the tournament winner of ``sample_size`` members drawn from the
    population (after a crossover with probability ``crossover_prob``). Each
    successful result joins the population and the oldest member leaves.
    """

    name = "regularized"
    SETTINGS = {
        "population_size": Setting(12, "members alive at once; the first ones are random"),
        "sample_size": Setting(4, "tournament size: members drawn to pick each parent"),
        "crossover_prob": Setting(0.0, CROSSOVER + " (0: mutation only, as in Real et al.)"),
    }

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        if self.params["sample_size"] > self.params["population_size"]:
            raise ValueError(f"strategy 'regularized' parameter `sample_size` must be <= "
                             f"`population_size` ({self.params['population_size']}), "
                             f"but got {self.params['sample_size']}")
        self.population: deque[tuple[AnyGenome, float, int]] = deque()  # (genome, fitness, born)

    def _propose(self) -> AnyGenome:
        propose = self.breeder()
        return self._fresh(self._initial_genome) if propose is None else self._breed(propose)

    def breeder(self) -> Callable[[], AnyGenome] | None:
        return self._child if len(self.population) >= self.params["population_size"] else None

    def _child(self) -> AnyGenome:
        genomes = [g for g, _, _ in self.population]
        fits = [f for _, f, _ in self.population]
        parent = tournament(genomes, fits, self.params["sample_size"], self.rng)
        if self.rng.random() < self.params["crossover_prob"]:
            other = tournament(genomes, fits, self.params["sample_size"], self.rng)
            parent = self._crossover(parent, other)
        return self._mutate(parent)

    def _observe(self, g: AnyGenome, fitness: float | None, objectives: tuple | None) -> None:
        if fitness is None:
            return
        self.population.append((g, fitness, self.told))
        if len(self.population) > self.params["population_size"]:
            self.population.popleft()

    def _extra_state(self) -> dict:
        return {"population": len(self.population),
                "oldest_born": self.population[0][2] if self.population else None}


class Generational(Strategy):
    """Generations: ask None while the generation's offspring are out; select when all are in."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.generation = 0
        self.parents: list[tuple[AnyGenome, float, tuple]] = []  # (genome, fitness, objectives)
        self._gen_size = self._first_size()
        self._issued = 0
        self._outstanding: set[str] = set()
        self._offspring: list[tuple[AnyGenome, float, tuple]] = []

    def _first_size(self) -> int:
        raise NotImplementedError

    def _next_size(self) -> int:
        raise NotImplementedError

    def _select(self, pool: list[tuple[AnyGenome, float, tuple]]) -> list[tuple[AnyGenome, float, tuple]]:
        raise NotImplementedError

    def _pick_parent(self) -> AnyGenome:
        return self.parents[int(self.rng.integers(len(self.parents)))][0]

    def _offspring_one(self) -> AnyGenome:
        if len(self.parents) >= 2 and self.rng.random() < self.params["crossover_prob"]:
            return self._crossover(self._pick_parent(), self._pick_parent())
        return self._mutate(self._pick_parent())

    def _propose(self) -> AnyGenome | None:
        if self._issued >= self._gen_size:
            return None
        return self._breed(self._offspring_one) if self.parents else self._fresh(self._initial_genome)

    def breeder(self) -> Callable[[], AnyGenome] | None:
        return self._offspring_one if self.parents else None

    def lineage(self) -> int:
        return self.generation

    def _on_ask(self, g: AnyGenome) -> None:
        self._issued += 1
        self._outstanding.add(g.key())

    def _objectives(self, g: AnyGenome, fitness: float, objectives: tuple | None) -> tuple:
        return (fitness,)

    def _observe(self, g: AnyGenome, fitness: float | None, objectives: tuple | None) -> None:
        key = g.key()
        if key not in self._outstanding:
            return  # a result from outside this generation: cached, not bred from
        self._outstanding.discard(key)
        if fitness is not None:
            self._offspring.append((g, fitness, self._objectives(g, fitness, objectives)))
        if self._issued >= self._gen_size and not self._outstanding:
            pool = self.parents + self._offspring
            self.parents = self._select(pool) if pool else []
            self.generation += 1
            self._gen_size, self._issued, self._offspring = self._next_size(), 0, []

    def _extra_state(self) -> dict:
        return {"generation": self.generation, "parents": len(self.parents),
                "generation_outstanding": len(self._outstanding),
                "generation_left_to_ask": self._gen_size - self._issued}


class MuPlusLambda(Generational):
    """(mu + lambda): ``mu`` random first; each generation breeds ``lambda_`` offspring
    (crossover with ``crossover_prob``, else mutation) and keeps the best ``mu`` of both."""

    name = "mu_plus_lambda"
    SETTINGS = {
        "mu": Setting(8, "parents kept each generation; the first generation is mu random genomes"),
        "lambda_": Setting(8, "offspring bred per generation"),
        "crossover_prob": Setting(0.5, CROSSOVER),
    }

    @classmethod
    def initial_size(cls, params: dict[str, Any]) -> int | None:
        return params["mu"]

    def _first_size(self) -> int:
        return self.params["mu"]

    def _next_size(self) -> int:
        return self.params["lambda_"]

    def _select(self, pool):
        return sorted(pool, key=lambda t: -t[1])[: self.params["mu"]]  # stable: ties keep order


class NSGA2(Generational):
    """NSGA-II on the objectives told (all maximised), default (fitness, -parameter count).

    Survivors by ``deap.tools.selNSGA2``; parents by binary tournament on
    (front rank, crowding distance)."""

    name = "nsga2"
    SETTINGS = {
        "population_size": Setting(12, "parents kept and offspring bred per generation"),
        "crossover_prob": Setting(0.5, CROSSOVER),
        "objectives": Setting("metric_params", "second objective beside the validation metric: "
                              "parameter count or inference time per sample",
                              choices=("metric_params", "metric_time")),
    }

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self._n_obj: int | None = None
        self._rank: list[tuple[int, float]] = []  # (front, -crowding) per parent

    def _first_size(self) -> int:
        return self.params["population_size"]

    _next_size = _first_size

    def _objectives(self, g: AnyGenome, fitness: float, objectives: tuple | None) -> tuple:
        if objectives is None:
            objectives = (fitness, -float(count_params(g, self.input_shape, self.n_outputs) or 0))
        objectives = tuple(float(x) for x in objectives)
        if self._n_obj is None:
            self._n_obj = len(objectives)
        if len(objectives) != self._n_obj or not all(math.isfinite(x) for x in objectives):
            raise ValueError(f"nsga2 needs {self._n_obj} finite objectives per result, "
                             f"but got {objectives!r}")
        return objectives

    def _select(self, pool):
        cands = [Candidate(i, obj) for i, (_, _, obj) in enumerate(pool)]
        chosen = tools.selNSGA2(cands, self.params["population_size"])
        chosen.sort(key=lambda c: c.index)  # keep pool order for determinism downstream
        parents = [pool[c.index] for c in chosen]
        self._rank = [(0, 0.0)] * len(parents)
        cands = [Candidate(i, obj) for i, (_, _, obj) in enumerate(parents)]
        for r, front in enumerate(tools.sortNondominated(cands, len(cands))):
            tools.emo.assignCrowdingDist(front)
            for c in front:
                self._rank[c.index] = (r, -c.fitness.crowding_dist)
        return parents

    def _pick_parent(self) -> AnyGenome:
        i, j = (int(x) for x in self.rng.integers(len(self.parents), size=2))
        return self.parents[min(i, j, key=lambda k: (self._rank[k], k))][0]

    def pareto_front(self) -> list[tuple[AnyGenome, tuple]]:
        """Non-dominated members of the current parents, with their objectives."""
        return [(g, obj) for (g, _, obj), (r, _) in zip(self.parents, self._rank) if r == 0]

    def _extra_state(self) -> dict:
        return {**super()._extra_state(), "front_size": len(self.pareto_front())}


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (RegularizedEvolution, MuPlusLambda, NSGA2, RandomSearch)}
STRATEGY_PARAMS: dict[str, frozenset[str]] = {
    n: frozenset(c.SETTINGS) | ({"lambda"} if "lambda_" in c.SETTINGS else frozenset())
    for n, c in STRATEGIES.items()}


def make_strategy(name: str, space: SearchSpace, input_shape: tuple[int, ...], n_outputs: int,
                  rng_seed: int = 0, budget_evaluations: int | None = None,
                  budget_seconds: float | None = None, **params: Any) -> Strategy:
    """Build a strategy by name; ``params`` are its own settings (see ``STRATEGY_PARAMS``).

    ``clock`` (a zero-argument callable returning seconds) may be passed to drive
    the seconds budget in tests; ``initial`` (genomes valid for the space) are the first
    asks of the first population (``Strategy._initial_genome``); ``known``: keys of genomes
    an earlier run trained (``evolve.start_from``), never asked (but those in ``initial``).
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    for key, v in (("budget_evaluations", budget_evaluations), ("budget_seconds", budget_seconds)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
            raise ValueError(f"`{key}` must be a number >= 0 or None, but got {v!r}")
    return STRATEGIES[name](space, input_shape, n_outputs, rng_seed=rng_seed,
                            budget_evaluations=budget_evaluations,
                            budget_seconds=budget_seconds, **params)
