"""Benchmark: data-parallel members (fused mpi4py allreduce) against one rank and against TF.

For Dense stacks of about 1M and 10M parameters, at the same global batch, side by side
in one run:

(a) step time of G=2 (``ensemble.runtime.data_parallel``, two MPI ranks, shards of each global
    batch) against G=1 (one rank, the other asleep);
(b) the fused allreduce inside a G=2 step against a raw mpi4py ``Allreduce`` of the same
    number of bytes (preallocated numpy buffers, no TensorFlow), made between the same
    steps (after a Barrier, so the machine's state is the same for both) and again in a
    tight loop after training (``raw_allreduce_idle_s``). All are timed the same way:
    from the moment the last rank enters until the last rank leaves, so waiting for a
    slower rank (load imbalance, a shared core) is not counted as communication; the
    in-step time with that wait is reported too (``allreduce_in_step_wall_s``), and
    ``fused_op_s`` is the whole Python side of the step's fused op (packing included);
(c) step time against TensorFlow's MultiWorkerMirroredStrategy (gRPC ring collectives;
    TF_CONFIG with two localhost workers, two processes). Keras 3's ``fit`` does not run
    under that strategy (keras-team/keras#20585), so its step is a custom training loop
    (``strategy.run``; the Keras optimizer all-reduces the gradients); the reason is
    recorded in the JSON. If the strategy cannot run at all, the JSON says why.

Every case runs ``--warmup`` steps first (tracing, first allocations), then times
``--steps`` steps; figures are medians. One TensorFlow thread per process, as in a run.

    python scripts/bench_allreduce.py [--batch 128] [--steps 10] [--warmup 3]

The last line of output is one JSON object with all figures and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = {"1m": (512, [1024, 512]), "10m": (1024, [2048, 2048, 2048])}
CLASSES = 10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per case")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per sub-run")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--worker", choices=["mpi", "mwms"], help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ports", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "mpi":
        return mpi_worker(args)
    if args.worker == "mwms":
        return mwms_worker(args)
    return drive(args)


# ----------------------------------------------------------------------------- driver

def drive(args: argparse.Namespace) -> int:
    command = (f"python scripts/bench_allreduce.py --models {' '.join(args.models)} --batch {args.batch} "
               f"--steps {args.steps} --warmup {args.warmup}")
    report: dict = {"command": command, "cpus": os.cpu_count(), "global_batch": args.batch,
                    "steps": args.steps, "warmup": args.warmup, "threads_per_process": 1, "models": {}}
    t0 = time.monotonic()
    common = ["--models", *args.models, "--batch", str(args.batch), "--steps", str(args.steps),
              "--warmup", str(args.warmup)]
    mpiexec = Path(sys.executable).parent / "mpiexec"
    mpi = run_json([str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", "2", sys.executable, __file__,
                    "--worker", "mpi", *common], args.timeout)
    report["mpi"] = {"status": mpi.pop("status")}
    for name, figures in mpi.get("models", {}).items():
        report["models"][name] = figures
        print(f"{name}: {json.dumps(figures)}", flush=True)

    ports = free_ports(2)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "mwms", "--index", str(i),
                               "--ports", *map(str, ports), *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
             for i in range(2)]
    mwms = collect_mwms(procs, args.timeout)
    report["mwms"] = {k: v for k, v in mwms.items() if k != "models"}
    for name, figures in mwms.get("models", {}).items():
        entry = report["models"].setdefault(name, {})
        entry["mwms_step_s"] = figures["step_s"]
        if entry.get("g2_step_s"):
            entry["mwms_over_g2_step"] = round(figures["step_s"] / entry["g2_step_s"], 3)
    report["seconds"] = round(time.monotonic() - t0, 1)
    line = json.dumps(report)
    if args.out:
        args.out.write_text(line + "\n")
    print(line, flush=True)
    return 0


def child_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_json(cmd: list[str], timeout: float) -> dict:
    """Run a sub-benchmark; its ``RESULT {json}`` line, or a status saying why there is none."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s"}
    return parse_result(proc.returncode, proc.stdout, proc.stderr)


def parse_result(code: int, stdout: str, stderr: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if code != 0 or not lines:
        tail = " | ".join(ln for ln in (stderr or stdout).strip().splitlines()[-3:])
        return {"status": f"failed (exit {code}): {tail[-600:]}"}
    return {"status": "ok", **json.loads(lines[-1][len("RESULT "):])}


def collect_mwms(procs: list[subprocess.Popen], timeout: float) -> dict:
    results = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(parse_result(p.returncode, out, err))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            return {"status": f"timed out after {timeout:.0f} s"}
    failed = [r["status"] for r in results if r["status"] != "ok"]
    return {"status": failed[0]} if failed else results[0]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# ----------------------------------------------------------------------------- shared pieces

def setup_tensorflow():
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.get_logger().setLevel("ERROR")
    return tf


def build(name: str, seed: int = 0):
    import keras
    keras.utils.set_random_seed(seed)
    features, hidden = MODELS[name]
    layers = [keras.Input((features,))]
    layers += [keras.layers.Dense(units, activation="relu") for units in hidden]
    model = keras.Sequential([*layers, keras.layers.Dense(CLASSES, activation="softmax")])
    return model


def data(name: str, rows: int):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, MODELS[name][0])).astype(np.float32)
    return x, rng.integers(0, CLASSES, rows).astype(np.int64)


def median(values) -> float:
    return float(np.median(values)) if len(values) else float("nan")


# ----------------------------------------------------------------------------- MPI side

def mpi_worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from ensemble.runtime.mpi import polite_barrier
    comm = MPI.COMM_WORLD
    setup_tensorflow()
    out: dict = {"models": {}}
    for name in args.models:
        g2 = fit_steps(name, args, comm)
        traces = comm.gather(g2.pop("trace"))
        between = comm.gather(g2.pop("raw_trace"))
        alone = fit_steps(name, args, None, shard=(comm.Get_rank(), comm.Get_size()))
        raw = raw_allreduce(comm, g2["buffer_floats"], args.steps, args.warmup)
        polite_barrier(comm)                       # rank 1 sleeps while rank 0 trains alone
        g1 = fit_steps(name, args, None) if comm.Get_rank() == 0 else None
        polite_barrier(comm)
        if comm.Get_rank() == 0:
            out["models"][name] = summarize(g1, g2, alone, traces, between, raw, args.warmup)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    return 0


def fit_steps(name: str, args: argparse.Namespace, comm, shard=None) -> dict:
    """Train ``warmup + steps`` global batches with Keras fit; per-step times (and the trace).

    ``comm=None`` with a ``shard``: each rank trains its shard on its own, no allreduce
    (the compute of a G=2 step on this machine, without the communication).
    """
    import keras

    from datafeed.pipeline import make_dataset
    from ensemble.runtime.data_parallel import broadcast_weights, make_data_parallel

    model = build(name)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  jit_compile=False)
    broadcast_weights(model, comm)
    dp = make_data_parallel(model, comm)
    if dp:
        dp[0].fused.trace = []
    rows = args.batch * (args.warmup + args.steps)
    x, y = data(name, rows)
    shard = (comm.Get_rank(), comm.Get_size()) if comm is not None else shard
    ds = make_dataset(x, y, np.arange(rows), args.batch, seed=3, shard=shard)
    timer = StepTimer()
    raw = [RawAllreduceBetweenSteps(comm, dp[0].fused)] if dp else []
    model.fit(ds, epochs=1, verbose=0, callbacks=dp[:1] + [timer, *raw] + dp[1:])
    result = {"params": int(model.count_params()), "step_s": median(timer.times[args.warmup:])}
    if dp:
        fused = dp[0].fused
        timed = fused.trace[args.warmup:]
        spans = timer.spans[args.warmup:]
        result.update(before_s=median([t[0] - b for t, (b, _) in zip(timed, spans)]),
                      after_s=median([e - t[3] for t, (_, e) in zip(timed, spans)]))
        result.update(trace=[(t[1], t[2]) for t in fused.trace], buffer_floats=fused.nbytes // 4,
                      raw_trace=raw[0].trace,
                      fused_op_s=median([t[3] - t[0] for t in timed]))
    return result


class StepTimer:
    """Callback-like timer of each fit step (a keras Callback, made lazily to keep imports late)."""

    def __new__(cls):
        import keras

        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.times, self.spans, self.start = [], [], 0.0

            def on_train_batch_begin(self, batch, logs=None):
                self.start = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                end = time.perf_counter()
                self.times.append(end - self.start)
                self.spans.append((self.start, end))
        return Timer()


def RawAllreduceBetweenSteps(comm, fused):
    """A callback: after every step, a plain mpi4py Allreduce of the fused buffer's bytes."""
    import keras

    class Raw(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.trace, self.send, self.recv = [], None, None

        def on_train_batch_end(self, batch, logs=None):
            if self.send is None:
                floats = fused.nbytes // 4
                self.send = np.random.default_rng(comm.Get_rank()).standard_normal(floats).astype(np.float32)
                self.recv = np.empty_like(self.send)
            comm.Barrier()
            t1 = time.perf_counter()
            comm.Allreduce(self.send, self.recv)
            self.trace.append((t1, time.perf_counter()))
    return Raw()


def raw_allreduce(comm, floats: int, steps: int, warmup: int) -> list[tuple[float, float]]:
    """Plain mpi4py Allreduce of ``floats`` float32, preallocated buffers; (start, end) per call."""
    send = np.random.default_rng(comm.Get_rank()).standard_normal(floats).astype(np.float32)
    recv = np.empty_like(send)
    trace = []
    for _ in range(warmup + steps):
        comm.Barrier()
        t1 = time.perf_counter()
        comm.Allreduce(send, recv)
        trace.append((t1, time.perf_counter()))
    return comm.gather(trace[warmup:])


def collective_times(traces: list[list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """Per call: last rank in -> last rank out (pure communication), and rank 0's own wall time."""
    pure = [max(t[i][1] for t in traces) - max(t[i][0] for t in traces) for i in range(len(traces[0]))]
    wall = [end - start for start, end in traces[0]]
    return pure, wall


def summarize(g1: dict, g2: dict, alone: dict, traces, between, raw_traces, warmup: int) -> dict:
    pure, wall = collective_times([t[warmup:] for t in traces])
    raw, _ = collective_times([t[warmup:] for t in between])
    idle, _ = collective_times(raw_traces)
    floats = g2["buffer_floats"]
    figures = {
        "params": g2["params"], "buffer_mib": round(floats * 4 / 2**20, 2),
        "g1_step_s": round(g1["step_s"], 5), "g2_step_s": round(g2["step_s"], 5),
        "g2_speedup_over_g1": round(g1["step_s"] / g2["step_s"], 3),
        "g2_without_allreduce_step_s": round(alone["step_s"], 5),
        "g2_until_fused_op_s": round(g2["before_s"], 5),
        "g2_after_fused_op_s": round(g2["after_s"], 5),
        "allreduce_in_step_s": round(median(pure), 5),
        "allreduce_in_step_wall_s": round(median(wall), 5),
        "fused_op_s": round(g2["fused_op_s"], 5),
        "raw_allreduce_s": round(median(raw), 5),
        "raw_allreduce_idle_s": round(median(idle), 5),
    }
    figures["allreduce_overhead_ratio"] = round(figures["allreduce_in_step_s"] / figures["raw_allreduce_s"], 3)
    figures["allreduce_share_of_g2_step"] = round(figures["allreduce_in_step_s"] / figures["g2_step_s"], 3)
    return figures


# ----------------------------------------------------------------------------- TF MultiWorkerMirroredStrategy

def mwms_worker(args: argparse.Namespace) -> int:
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in args.ports]},
        "task": {"type": "worker", "index": args.index}})
    tf = setup_tensorflow()
    import keras
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    out: dict = {"replicas": int(strategy.num_replicas_in_sync),
                 "communication": "MultiWorkerMirroredStrategy, gRPC ring collectives (CPU)",
                 "loop": "custom (strategy.run, optimizer.apply all-reduces)",
                 "keras_fit": keras_fit_under(strategy), "models": {}}
    for name in args.models:
        with strategy.scope():
            model = build(name)
            optimizer = keras.optimizers.Adam(1e-3)
            optimizer.build(model.trainable_variables)
        rows = args.batch * (args.warmup + args.steps)
        x, y = data(name, rows)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch).with_options(options)
        iterator = iter(strategy.experimental_distribute_dataset(ds))

        def replica_step(bx, by, model=model, optimizer=optimizer):
            with tf.GradientTape() as tape:
                per_row = keras.losses.sparse_categorical_crossentropy(by, model(bx, training=True))
                loss = tf.nn.compute_average_loss(per_row, global_batch_size=args.batch)
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return loss

        @tf.function
        def step(it):
            bx, by = next(it)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(bx, by)),
                                   axis=None)

        times = []
        for _ in range(args.warmup + args.steps):
            t = time.perf_counter()
            float(step(iterator))
            times.append(time.perf_counter() - t)
        out["models"][name] = {"params": int(model.count_params()), "step_s": round(median(times[args.warmup:]), 5)}
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def keras_fit_under(strategy) -> str:
    """Whether Keras' own fit runs under the strategy (a tiny model, one step)."""
    import keras
    import tensorflow as tf
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    ds = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), np.float32), np.ones((8, 2), np.float32))).batch(4)
    try:
        model.fit(ds, epochs=1, steps_per_epoch=1, verbose=0)
        return "ok"
    except Exception as exc:                    # noqa: BLE001 - the reason goes into the report
        first = str(exc).splitlines()[0][:120]
        return f"failed: {type(exc).__name__}: {first} ... (known: keras-team/keras#20585)"


if __name__ == "__main__":
    sys.exit(main())
