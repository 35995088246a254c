"""A surrogate of fitness that screens bred children before any of them trains (as MENNDL did).

When a strategy breeds a child, it breeds ``candidates`` of them instead (each new, none
trained or handed out before: ``Strategy._breed``), and the surrogate picks the one to train:
the highest *expected improvement* over the best fitness so far, from a random forest's mean
and its spread across trees. The forest regresses fitness on genome features
(``features``: depth, widths, kernels, downsampling, receptive field, parameter count,
optimizer, activation, learning rate, batch size ...) of free and structured genomes alike (a
structured genome is read as the layer list it lowers to).

Cost on the master, kept small at scale:

- it screens only after ``min_results`` results, and refits in batches: at ``min_results``,
  then each time the results grew by a tenth (at least ``REFIT_MIN`` more); a fit sees the
  latest ``MAX_TRAIN`` results at most, so its cost is bounded and shared by the asks until
  the next one;
- a screen reads the trees' arrays directly (no joblib, no input checks).

Determinism: which results a fit sees is a function of how many results there are (the
batch boundaries), never of when asks happen, and the forest's seed is derived from the
strategy's seed and that count, so ``Strategy.replay`` rebuilds the same surrogate.
A failed result (fitness None) counts as the worst fitness of the fit's data.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from evolve.decode import count_params
from evolve.space import SearchSpace
from evolve.structured import AnyGenome, StructuredGenome

#: the least number of new results between two fits
REFIT_MIN = 8
#: a fit sees the latest results only, at most this many
MAX_TRAIN = 2000
TREES = 32


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


class Featurizer:
    """Genome -> fixed-length float vector; the columns are ``names``."""

    BASE = ("n_conv", "n_maxpool", "n_avgpool", "n_dense", "n_dropout", "n_batchnorm", "n_residual",
            "depth", "log2_filters_mean", "log2_filters_max", "log2_filters_first", "kernel_mean", "kernel_max",
            "log2_downsampling", "log2_receptive_field", "conv_before_pool", "log2_units_mean", "log2_units_max",
            "dropout_mean", "dropout_max", "log10_params", "log10_lr", "log2_batch_size", "flatten",
            "global_max")

    def __init__(self, space: SearchSpace, input_shape: tuple[int, ...], n_outputs: int):
        self.space, self.input_shape, self.n_outputs = space, tuple(input_shape), int(n_outputs)
        self.optimizers = tuple(space.optimizers)
        self.activations = tuple(space.activations)
        self.names = (*self.BASE, *(f"opt_{o}" for o in self.optimizers),
                      *(f"act_{a}" for a in self.activations))

    def __call__(self, genome: AnyGenome) -> np.ndarray:
        g = genome.to_genome() if isinstance(genome, StructuredGenome) else genome
        counts = dict.fromkeys(("conv", "maxpool", "avgpool", "dense", "dropout", "batchnorm"), 0)
        filters, kernels, units, rates, acts = [], [], [], [], []
        residual, down, rf, jump, first_pool, conv_first = 0, 1.0, 1.0, 1.0, None, 0.0
        for gene in g.layers:
            counts[gene.kind] = counts.get(gene.kind, 0) + 1
            residual += bool(gene.get("residual"))
            if gene.get("activation") is not None:
                acts.append(gene.get("activation"))
            if gene.kind == "conv":
                k, s = int(gene.get("kernel_size", 1)), int(gene.get("strides", 1))
                filters.append(int(gene.get("filters", 1)))
                kernels.append(k)
                rf += (k - 1) * jump
                jump *= s
                down *= s
            elif gene.kind in ("maxpool", "avgpool"):
                p = int(gene.get("pool_size", 1))
                if first_pool is None:
                    first_pool = p
                    conv_first = float(bool(filters))
                rf += (p - 1) * jump
                jump *= p
                down *= p
            elif gene.kind == "dense":
                units.append(int(gene.get("units", 1)))
            elif gene.kind == "dropout":
                rates.append(float(gene.get("rate", 0.0)))
        params = count_params(genome, self.input_shape, self.n_outputs)
        lf = [_log2(f) for f in filters]
        lu = [_log2(u) for u in units]
        base = [counts["conv"], counts["maxpool"], counts["avgpool"], counts["dense"], counts["dropout"],
                counts["batchnorm"], residual, len(g.layers),
                _mean(lf), max(lf, default=0.0), lf[0] if lf else 0.0, _mean(kernels), max(kernels, default=0),
                _log2(down), _log2(rf), conv_first if first_pool is not None else float(bool(filters)),
                _mean(lu), max(lu, default=0.0), _mean(rates), max(rates, default=0.0),
                math.log10(params) if params else 0.0, math.log10(g.learning_rate), _log2(g.batch_size),
                float(g.reduction == "flatten"), float(g.reduction == "global_max")]
        opt = [float(g.optimizer == o) for o in self.optimizers]
        act = [acts.count(a) / len(acts) if acts else 0.0 for a in self.activations]
        return np.asarray(base + opt + act, dtype=np.float64)


def _expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float) -> np.ndarray:
    """E[max(f - best, 0)] for f ~ N(mu, sigma); the mean's excess where sigma is 0."""
    from scipy.special import ndtr
    gain = mu - best
    safe = np.maximum(sigma, 1e-12)
    z = gain / safe
    ei = gain * ndtr(z) + safe * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return np.where(sigma > 1e-12, ei, np.maximum(gain, 0.0))


class Surrogate:
    """Random-forest fitness model: ``observe`` every result, ``choose`` among bred children.

    ``candidates``: how many children a strategy breeds per child it sends (``evolve.surrogate_candidates``);
    ``min_results``: results before the first fit (``evolve.surrogate_min_results``)."""

    def __init__(self, space: SearchSpace, input_shape: tuple[int, ...], n_outputs: int, candidates: int,
                 min_results: int, seed: int = 0, trees: int = TREES, max_train: int = MAX_TRAIN):
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"surrogate `candidates` must be an integer >= 1, but got {candidates!r}")
        if isinstance(min_results, bool) or not isinstance(min_results, int) or min_results < 2:
            raise ValueError(f"surrogate `min_results` must be an integer >= 2, but got {min_results!r}")
        self.features = Featurizer(space, input_shape, n_outputs)
        self.candidates, self.min_results = candidates, min_results
        self.seed, self.trees, self.max_train = int(seed) % 2 ** 32, int(trees), int(max_train)
        self._x: list[np.ndarray] = []
        self._y: list[float] = []                   # nan: failed
        self.trained: set[str] = set()              # keys of genomes with a result
        self._fitted_at = 0                          # results the current forest was fitted on
        self._trees: list[Any] = []
        self._best = -math.inf
        self.stats = {"fits": 0, "fit_seconds": 0.0, "screens": 0, "screen_seconds": 0.0}

    # -- learning ---------------------------------------------------------------------------
    def observe(self, genome: AnyGenome, fitness: float | None) -> None:
        """A result (fitness maximised; None or NaN: failed)."""
        self.trained.add(genome.key())
        self._x.append(self.features(genome))
        ok = fitness is not None and math.isfinite(fitness)
        self._y.append(float(fitness) if ok else math.nan)

    @property
    def ready(self) -> bool:
        """Enough results to screen with."""
        return len(self._y) >= self.min_results

    def boundary(self, n: int) -> int:
        """How many results a fit made with ``n`` results known sees: the last batch boundary
        <= n (``min_results``, then each a tenth and at least ``REFIT_MIN`` more); 0 before."""
        b = 0 if n < self.min_results else self.min_results
        while b:
            nxt = b + max(REFIT_MIN, b // 10)
            if nxt > n:
                break
            b = nxt
        return b

    def _refit(self) -> None:
        b = self.boundary(len(self._y))
        if b == self._fitted_at:
            return
        start = time.perf_counter()
        lo = max(0, b - self.max_train)
        x, y = np.asarray(self._x[lo:b]), np.asarray(self._y[lo:b])
        finite = np.isfinite(y)
        self._fitted_at = b
        if finite.sum() < 2:
            self._trees = []
            return
        y = np.where(finite, y, y[finite].min())
        from sklearn.ensemble import RandomForestRegressor
        forest = RandomForestRegressor(n_estimators=self.trees, min_samples_leaf=2, max_features=0.5,
                                       random_state=(self.seed * 1_000_003 + b) % 2 ** 32, n_jobs=1)
        forest.fit(x.astype(np.float32), y)
        self._trees = [t.tree_ for t in forest.estimators_]
        self._best = float(y.max())
        self.stats["fits"] += 1
        self.stats["fit_seconds"] += time.perf_counter() - start

    def predict(self, genomes: Sequence[AnyGenome]) -> tuple[np.ndarray, np.ndarray]:
        """Mean and spread over the trees of the predicted fitness (zeros before a fit)."""
        self._refit()
        x = np.ascontiguousarray([self.features(g) for g in genomes], dtype=np.float32)
        if not self._trees:
            return np.zeros(len(genomes)), np.zeros(len(genomes))
        per_tree = np.stack([t.predict(x).reshape(len(x), -1)[:, 0] for t in self._trees])
        return per_tree.mean(axis=0), per_tree.std(axis=0)

    # -- screening --------------------------------------------------------------------------
    def choose(self, genomes: Sequence[AnyGenome]) -> int:
        """Index of the child to train: not trained before, highest expected improvement
        (the first such on ties); the first untrained one before any fit."""
        start = time.perf_counter()
        fresh = [i for i, g in enumerate(genomes) if g.key() not in self.trained]
        if not fresh:
            raise ValueError("surrogate: every candidate was trained already")
        if len(fresh) == 1:
            return fresh[0]
        mu, sigma = self.predict([genomes[i] for i in fresh])
        pick = fresh[int(np.argmax(_expected_improvement(mu, sigma, self._best)))] if self._trees else fresh[0]
        self.stats["screens"] += 1
        self.stats["screen_seconds"] += time.perf_counter() - start
        return pick

    def choose_many(self, genomes: Sequence[AnyGenome], n: int) -> list[int]:
        """Indices of the ``n`` children to train among ``genomes`` (a batch screened at once,
        one prediction for all: ``evolve.screening``): those not trained before, the highest
        expected improvement first (the first ones before any fit)."""
        start = time.perf_counter()
        fresh = [i for i, g in enumerate(genomes) if g.key() not in self.trained]
        if len(fresh) <= n:
            return fresh
        mu, sigma = self.predict([genomes[i] for i in fresh])
        if not self._trees:
            return fresh[:n]
        order = np.argsort(-_expected_improvement(mu, sigma, self._best), kind="stable")[:n]
        self.stats["screens"] += n
        self.stats["screen_seconds"] += time.perf_counter() - start
        return [fresh[int(i)] for i in order]

    def state(self) -> dict:
        """Small JSON-able summary for logs."""
        return {"surrogate_results": len(self._y), "surrogate_fitted_on": self._fitted_at,
                "surrogate_fits": self.stats["fits"], "surrogate_fit_seconds": round(self.stats["fit_seconds"], 3),
                "surrogate_screens": self.stats["screens"],
                "surrogate_screen_seconds": round(self.stats["screen_seconds"], 3)}
