"""A new network's training step traced once, not twice: what it saves per candidate.

    python scripts/bench_tracing.py [--count 6] [--problem signals] [--write docs/scale.md]

Keras 3 on TensorFlow builds the optimizer's and the metrics' variables inside the first trace
of a model's training step, and TensorFlow traces a function that created variables a second
time; ``ensemble.train.architecture.build_training_state`` creates them before ``fit``, so the
step is traced once (``docs/search.md``). This trains the same random genomes of the structured
space (as a search's first population draws them) on each problem of the suite (1,500
samples, 20 epochs, patience 4, as the search benchmark's candidates) through the project's own
member path (``ensemble.train.member.run_member``, no kept models), once with the early build and
once without it (Keras alone, what a plain ``model.fit`` does, DeepHyper's candidates among
them), in alternating order, in one process, and prints per problem the median seconds of
each and the median ratio (with its range) of a candidate's whole time, first epoch and the
rest. Both runs of a genome train bit for bit alike (``tests/ensemble/test_traced.py``), so
the epochs trained are the same and the ratio is the tracing alone. CPU seconds of this
process (one TensorFlow thread), so another job on the machine moves them less than wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))


def _data(problem: str, samples: int):
    from search_problems import PROBLEMS, _split
    make, task = PROBLEMS[problem]
    x, y = make(n=samples)
    tr, va, te = _split(len(x), 0)
    meta = {"task": task, "input_shape": list(x.shape[1:]),
            "n_outputs": int(y.max()) + 1 if task == "classification" else 1}
    data = {"x_train": x[tr], "y_train": y[tr], "x_val": x[va], "y_val": y[va], "x_test": x[te], "y_test": y[te]}
    return data, meta


def measure(problem: str, count: int, samples: int, epochs: int, patience: int) -> dict[str, list[tuple]]:
    """Per side ("once", "twice"): (CPU seconds of the member, of its first epoch, of the rest)
    for each of ``count`` genomes."""
    import ensemble.train.architecture as architecture
    from ensemble.config import resolve_config
    from ensemble.results.rundir import RunDirectory
    from ensemble.train.member import run_member
    from evolve import SearchSpace, decode
    from evolve.structured_operators import random_structured
    data, meta = _data(problem, samples)
    train = resolve_config({"mode": "evolve", "data": {"source": f"{problem}.npz", "task": meta["task"]},
                            "train": {"epochs": epochs, "patience": patience}}).train.to_dict()
    shape, outputs = tuple(meta["input_shape"]), meta["n_outputs"]
    space = SearchSpace.from_config({"space": "structured", "max_params": 100000}, input_rank=len(shape))
    rng = np.random.default_rng(7)
    early = architecture.build_training_state
    out: dict[str, list[tuple]] = {"once": [], "twice": []}
    with tempfile.TemporaryDirectory(prefix="bench_tracing_") as folder:
        for i in range(-1, count):                 # -1: a warm-up (the process's first fit), not counted
            genome = random_structured(rng, space, shape, outputs)
            # a candidate's spec as ``SearchSource._spec`` makes it: the [train] settings, the genome's three
            spec = {"id": f"g{i + 1}", "arch": "evolved", "layers": decode(genome, shape, space, outputs),
                    "model": None, "params": {}, "seed": 1000 + i, **train,
                    "optimizer": genome.optimizer, "learning_rate": genome.learning_rate,
                    "batch_size": genome.batch_size}
            for side in (("once", "twice") if i % 2 == 0 else ("twice", "once")):
                architecture.build_training_state = early if side == "once" else (lambda model, dataset: None)
                try:
                    started = time.process_time()
                    record = run_member(dict(spec), data, meta, RunDirectory(Path(folder) / side), 0)
                    seconds = time.process_time() - started
                finally:
                    architecture.build_training_state = early
                costs = record.get("costs", {})
                if i < 0:
                    continue
                out[side].append((seconds, costs.get("first_epoch", np.nan), costs.get("epochs", np.nan)))
                print(f"{problem} {i} {side}: {seconds:.2f} s CPU, first epoch {out[side][-1][1]:.2f} s, "
                      f"{record.get('epochs')} epochs, {record['status']}  {genome.summary(shape)}", flush=True)
    return out


def table(results: dict[str, dict[str, list[tuple]]]) -> str:
    rows = ["| problem | genomes | seconds per candidate, traced twice (Keras alone) | traced once | "
            "ratio once / twice: candidate (range) | first epoch | later epochs |", "|---|---|---|---|---|---|---|"]
    for problem, sides in results.items():
        once, twice = np.array(sides["once"], dtype=float), np.array(sides["twice"], dtype=float)
        ratio = once / twice
        rows.append(f"| {problem} | {len(once)} | {np.median(twice[:, 0]):.2f} | {np.median(once[:, 0]):.2f} | "
                    f"{np.median(ratio[:, 0]):.2f} ({ratio[:, 0].min():.2f}-{ratio[:, 0].max():.2f}) | "
                    f"{np.nanmedian(ratio[:, 1]):.2f} | {np.nanmedian(ratio[:, 2]):.2f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problem", help="one problem of the suite (default: signals, stripes and peaks)")
    p.add_argument("--count", type=int, default=6, help="genomes per problem")
    p.add_argument("--samples", type=int, default=1500)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--patience", type=int, default=4)
    p.add_argument("--write", help="a docs page to write the table into (between <!-- bench_tracing --> marks)")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from ensemble.runtime.env import configure_tensorflow
    configure_tensorflow(1, traced_models=0)
    problems = [args.problem] if args.problem else ["signals", "stripes", "peaks"]
    results = {pr: measure(pr, args.count, args.samples, args.epochs, args.patience) for pr in problems}
    text = (f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: `python scripts/bench_tracing.py "
            f"--count {args.count}`\n\n{table(results)}")
    print("\n" + text)
    if args.write:
        from benchkit import write_block
        write_block(Path(args.write), "bench_tracing", text)


if __name__ == "__main__":
    main()
