"""What the default ensemble selection costs against plain greedy, on the same pool.

    python scripts/bench_selection.py [--candidates 100 500] [--rows 270] [--classes 10]

A pool of made-up classifiers (digits-shaped validation predictions: rows x classes, each
member's accuracy drawn between weak and strong) is selected three ways in one sitting:
greedy forward selection on validation log loss (what ``method = "greedy"`` does),
bagged selection (20 bags of half the pool), and the default ``method = "auto"`` (every
uniform top-k, greedy, bagged and shrunk fitted on 4 of 5 folds of the validation rows
and scored on the fifth, then the chosen one on all rows). Prints seconds and the ratio
to greedy: the default's extra cost is paid once per run, in ``finalise``, on at most
``ensemble.candidates`` members.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ensemble.results.selection import choose_ensemble


def pool(m: int, n: int, c: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    out = {}
    for i in range(m):
        logits = rng.uniform(1.0, 3.0) * np.eye(c)[y] + rng.normal(0.0, 1.0, (n, c))
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        out[f"m{i:05d}"] = e / e.sum(axis=1, keepdims=True)
    return out, y


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", type=int, nargs="+", default=[100, 500])
    p.add_argument("--rows", type=int, default=270)
    p.add_argument("--classes", type=int, default=10)
    args = p.parse_args()
    print("| candidates | greedy s | bagged s | auto s | auto chose | effective size | auto / greedy |")
    print("|---|---|---|---|---|---|---|")
    for m in args.candidates:
        preds, y = pool(m, args.rows, args.classes)
        times, chosen = {}, None
        for method in ("greedy", "bagged", "auto"):
            t = time.perf_counter()
            choice = choose_ensemble(preds, y, "log_loss", method=method)
            times[method] = time.perf_counter() - t
            chosen = choice
        print(f"| {m:,} | {times['greedy']:.2f} | {times['bagged']:.2f} | {times['auto']:.2f} | "
              f"{chosen['method']} | {chosen['effective_size']:.1f} | {times['auto'] / times['greedy']:.1f}x |")


if __name__ == "__main__":
    main()
