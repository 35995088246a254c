"""Weight inheritance (``evolve.inherit``): a child bred by mutation starts from its parent's
trained weights in every layer whose shape the mutation left unchanged (Lamarckian
evolution, as in Real et al.'s large-scale evolution of image classifiers and LEMONADE's
network morphisms); the other layers keep their fresh initialisation.

Layers are matched in order by their kind and the shapes of their weights, as the longest
common subsequence of the two models' weighted layers: a mutation that inserts or removes
a layer shifts the rest, and they still match. The optimizer starts fresh.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

log = logging.getLogger(__name__)


def signature(layer) -> tuple:
    return (type(layer).__name__, tuple(tuple(w.shape) for w in layer.weights))


def weighted_layers(model) -> list:
    return [layer for layer in model.layers if layer.weights]


def match_layers(child: list[tuple], parent: list[tuple]) -> list[tuple[int, int]]:
    """(child index, parent index) pairs of equal signatures, in order: the longest common
    subsequence (dynamic programming; models have tens of layers)."""
    n, m = len(child), len(parent)
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i][j] = best[i + 1][j + 1] + 1 if child[i] == parent[j] else max(best[i + 1][j], best[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if child[i] == parent[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def inherit_weights(model, parent_path: str | Path) -> dict:
    """Copy the parent's weights (a saved ``.keras`` model) into ``model`` wherever a layer
    matches; returns what was inherited, for the journal. A parent file that is gone
    (released since the child was bred) inherits nothing and says so."""
    import keras
    path = Path(parent_path)
    if not path.is_file():
        return {"layers": [], "params": 0, "note": f"the parent's model file {path.name} is gone"}
    parent = keras.models.load_model(path, compile=False)
    mine, theirs = weighted_layers(model), weighted_layers(parent)
    pairs = match_layers([signature(x) for x in mine], [signature(x) for x in theirs])
    names, params = [], 0
    for i, j in pairs:
        mine[i].set_weights(theirs[j].get_weights())
        names.append(mine[i].name)
        params += sum(math.prod(w.shape) for w in mine[i].weights)
    total = sum(math.prod(w.shape) for w in model.weights)
    log.debug("inherited %d of %d layers (%d of %d values) from %s", len(pairs), len(mine), params, total, path)
    return {"layers": names, "of_layers": len(mine), "params": int(params), "of_params": int(total)}
