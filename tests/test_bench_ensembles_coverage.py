"""The panel's coverage band (scripts/bench_ensembles.py::coverage_se) is the spread split
conformal's coverage really has: from the test rows and from the calibration rows."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _bench():
    spec = importlib.util.spec_from_file_location("bench_ensembles", ROOT / "scripts" / "bench_ensembles.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("m, n, level", [(45, 89, 0.95), (100, 200, 0.8), (300, 600, 0.5)])
def test_coverage_se_is_the_spread_of_split_conformal_coverage(m, n, level):
    rng = np.random.default_rng(0)
    rank = min(m, math.ceil((m + 1) * level))
    covered = []
    for _ in range(3000):
        q = np.sort(np.abs(rng.normal(size=m)))[rank - 1]
        covered.append(np.mean(np.abs(rng.normal(size=n)) <= q))
    se = _bench().coverage_se(level, [(m, n)])
    assert se == pytest.approx(float(np.std(covered)), rel=0.06)
    # the binomial SE of the test rows alone understates it
    assert se > 1.3 * math.sqrt(level * (1 - level) / n)


def test_coverage_se_of_a_mean_over_seeds_shrinks_as_one_over_root_seeds():
    one = _bench().coverage_se(0.9, [(50, 100)])
    assert _bench().coverage_se(0.9, [(50, 100)] * 4) == pytest.approx(one / 2)
    assert _bench().coverage_se(0.9, [(None, 100)]) == pytest.approx(math.sqrt(0.09 / 100))
