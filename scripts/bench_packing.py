"""Packed members against the same members trained one after another, in one process and
one invocation: 8 members of ``configs/digits.toml``'s MLP (Dense 96, Dropout, Dense 48),
each with its own seed, on the run's own split, one TensorFlow thread.

    python scripts/bench_packing.py --members 8 --repeats 2

Prints the wall time of each way (alternated, ``--repeats`` times each), their ratio, and
the largest difference between a packed member's validation and test metrics and its twin's
trained alone (0 here: the packed member is the same member).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "digits.toml"))
    p.add_argument("--arch", default="mlp", help="the [[architectures]] name to train (Dense/Dropout layers)")
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    from ensemble.runtime.env import set_thread_env
    set_thread_env(1)
    from datafeed.prepare import prepare_with_rows
    from datafeed.readers import read_dataset
    from ensemble.config import load_config
    from ensemble.results.rundir import RunDirectory
    from ensemble.runtime.env import configure_tensorflow
    from ensemble.sources import member_specs
    from ensemble.train.member import run_member
    from ensemble.train.packed import pack_key, train_packed

    cfg = load_config(args.config)
    arch = next(a for a in cfg.architectures if a.name == args.arch)
    cfg = cfg.replace(architectures=(arch.replace(members=args.members),))
    x, y, info = read_dataset(cfg.data)
    data, meta, _ = prepare_with_rows(x, y, info, cfg.data, cfg.seed)
    specs = list(member_specs(cfg))
    if pack_key(specs[0]) is None:
        raise SystemExit(f"architecture {args.arch!r} cannot be packed (Dense and Dropout layers only)")
    configure_tensorflow(1)
    folder = Path(tempfile.mkdtemp(prefix="bench_packing_"))
    times = {"one by one": [], "packed": []}
    diff = 0.0
    try:
        train_packed(specs[:2], data, meta, RunDirectory(folder / "warm"), 0)     # imports and first traces
        for r in range(args.repeats):
            t0 = time.perf_counter()
            alone = [run_member(s, data, meta, RunDirectory(folder / f"alone{r}"), 0) for s in specs]
            times["one by one"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            packed = train_packed(specs, data, meta, RunDirectory(folder / f"packed{r}"), 0)
            times["packed"].append(time.perf_counter() - t0)
            for a, b in zip(alone, packed):
                for split in ("val", "test"):
                    diff = max(diff, max(abs(a[split][m] - b[split][m]) for m in a[split]))
            print(f"repeat {r + 1}: one by one {times['one by one'][-1]:.1f} s, packed {times['packed'][-1]:.1f} s",
                  flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    one, packed = statistics.median(times["one by one"]), statistics.median(times["packed"])
    epochs = sum(r["epochs"] for r in alone)
    print(f"\n{args.members} members of {args.arch!r} ({epochs} epochs in all): one by one {one:.1f} s, "
          f"packed {packed:.1f} s: {one / packed:.2f}x faster packed")
    print(f"largest |packed - alone| over every validation and test metric: {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
