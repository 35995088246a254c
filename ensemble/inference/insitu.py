"""In-situ inference: a running MPI simulation asks a finished run's ensemble about its own
local data every time step, and gets the mean and the uncertainty back on the same rank.

``ensemble.predict`` and ``predict_arrays`` spread members over ranks and gather the answer
on rank 0; a domain-decomposed simulation needs the opposite shape: every rank holds its
own part of the domain and wants the ensemble's answer for exactly that part, now, with no
trip through one rank. Two placements (``PLACEMENTS``):

- ``"local"``: every rank runs the whole ensemble as one combined graph (all members in one
  ``tf.function``, traced and warmed up once at load, batch sizes padded to fixed buckets).
  For small ensembles on CPU ranks.
- ``"node"``: the first ``servers_per_node`` ranks of each node (by shared memory) load the
  ensemble and serve the other ranks of that node over MPI; a server batches the requests
  of its clients into one graph call. For one GPU per node serving many CPU ranks.

The numbers are those of ``ensemble.predict`` (the members' raw outputs come from the
graph; decoding, combination and calibration are the same numpy float64 code,
``Task.decode``/``combine_outputs`` and ``task.calibration``). ``comm`` is any mpi4py
communicator; MPI itself is used only through ``ensemble.runtime.mpi``.
"""

from __future__ import annotations

import atexit
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ensemble.inference.combine import _calibrated, _squeeze
from ensemble.inference.inputs import prepare_features
from ensemble.inference.load import EnsembleRun, PredictError, load_run
from ensemble.task import get_task

log = logging.getLogger(__name__)

PLACEMENTS = ("local", "node")
#: batch sizes the graph runs on: a call of n rows is padded to the smallest bucket >= n,
#: larger calls go in chunks of the largest; so the runtime sees a fixed set of shapes
BUCKETS = (16, 64, 256, 1024, 4096)


@dataclass
class Timings:
    """What this rank's in-situ calls cost: calls, rows and seconds spent in ``predict``."""
    calls: int = 0
    rows: int = 0
    seconds: float = 0.0
    per_call: list[float] = field(default_factory=list)

    def add(self, rows: int, seconds: float) -> None:
        self.calls, self.rows, self.seconds = self.calls + 1, self.rows + rows, self.seconds + seconds
        self.per_call.append(seconds)


class CombinedGraph:
    """Every member of a run in one ``tf.function`` on normalised inputs: raw outputs side by
    side, traced once for any batch size (``[None, *input_shape]``), warmed up on every
    bucket at construction so no time step pays for tracing or first-call set-up."""

    def __init__(self, run: EnsembleRun, buckets: tuple[int, ...] = BUCKETS, threads: int = 1,
                 warm_up: bool = True):
        import keras
        import tensorflow as tf

        from ensemble.runtime.env import configure_tensorflow
        configure_tensorflow(threads)
        if not buckets or any(int(b) < 1 for b in buckets):
            raise PredictError(f"buckets must be positive batch sizes, but got {list(buckets)}")
        self.run, self.buckets = run, tuple(sorted({int(b) for b in buckets}))
        task = get_task(run.task)
        models, self.widths = [], []
        for m in run.members:
            try:
                model = keras.models.load_model(m.model_path, compile=False)
            except Exception as exc:
                raise PredictError(f"member {m.id!r}: cannot load {m.model_path!r}: {exc}") from exc
            want = task.output_width(run.n_outputs, m.gaussian)
            if model.output_shape[-1] != want:
                raise PredictError(f"member {m.id!r} outputs {model.output_shape[-1]} values per sample, but "
                                   f"{want} are expected for this {run.task} ensemble")
            models.append(model)
            self.widths.append(want)
        self._models = models                      # kept alive: the graph captures their variables

        @tf.function(input_signature=[tf.TensorSpec((None, *run.input_shape), tf.float32)])
        def forward(x):
            outs = [tf.cast(model(x, training=False), tf.float32) for model in models]
            return tf.concat(outs, axis=1) if len(outs) > 1 else outs[0]
        self._forward = forward
        # the traced graph itself: calling it skips the per-call argument binding of the
        # tf.function (half a millisecond and more, on a busy core)
        self._concrete = forward.get_concrete_function()
        self._tensor = tf.convert_to_tensor
        self._offsets = np.cumsum([0, *self.widths])
        if warm_up:
            for b in self.buckets:
                self._concrete(self._tensor(np.zeros((b, *run.input_shape), np.float32)))

    @property
    def traces(self) -> int:
        """How many times the graph was traced (1 after load, and it stays 1)."""
        return int(self._forward.experimental_get_tracing_count())

    def bucket(self, n: int) -> int:
        """The batch size ``n`` rows are padded to (the largest bucket for a chunk)."""
        return next((b for b in self.buckets if b >= n), self.buckets[-1])

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Every member's raw outputs on normalised ``x``, side by side: (n, sum of widths), float64."""
        n, top = len(x), self.buckets[-1]
        parts = []
        for start in range(0, n, top):
            chunk = x[start:start + top]
            b = self.bucket(len(chunk))
            if len(chunk) < b:
                padded = np.zeros((b, *chunk.shape[1:]), np.float32)
                padded[:len(chunk)] = chunk
                chunk = padded
            parts.append(self._concrete(self._tensor(chunk)).numpy()[:min(top, n - start)])
        if not parts:
            return np.zeros((0, int(self._offsets[-1])))
        return np.concatenate(parts).astype(np.float64)

    def predict(self, x: np.ndarray) -> dict:
        """The ensemble on normalised ``x``: what ``predict_arrays(run, x)`` returns."""
        run, task = self.run, get_task(self.run.task)
        raw = self.raw(np.ascontiguousarray(x, dtype=np.float32))
        outs = [task.decode(raw[:, a:b], m.y_shift, m.y_scale, m.gaussian, squeeze=False)
                for m, a, b in zip(run.members, self._offsets[:-1], self._offsets[1:])]
        part = task.combine_outputs(outs, np.array([m.weight for m in run.members]))
        return _calibrated(_squeeze(dict(part), run), run)


def rows(result: dict, start: int, stop: int) -> dict:
    """Rows ``start:stop`` of every array of a prediction (nested dicts such as "intervals" too)."""
    return {k: rows(v, start, stop) if isinstance(v, dict) else v[start:stop] for k, v in result.items()}


def stack(results: list[dict]) -> dict:
    """Predictions on consecutive row blocks as one (the inverse of ``rows``)."""
    first = results[0]
    return {k: stack([r[k] for r in results]) if isinstance(v, dict) else np.concatenate([r[k] for r in results])
            for k, v in first.items()}


class InSitu:
    """A finished run's ensemble inside a running simulation (see the module docstring).

    Made by ``load`` on every rank of ``comm``. ``serving`` is True on the ranks that serve
    their node (placement "node"): those call ``serve()``, which returns when every client
    has called ``close()``; the others (all ranks with "local") call ``predict(x)`` on their
    own data as often as they like and ``close()`` at the end. ``comm`` is then the
    simulation's communicator: every rank with "local", the client ranks with "node".
    """

    def __init__(self, run: EnsembleRun, placement: str, comm, graph: CombinedGraph | None, link=None):
        self.run, self.placement, self.comm = run, placement, comm
        self._graph, self._link = graph, link
        self.timings = Timings()
        self.closed = False

    @property
    def serving(self) -> bool:
        return self._link is not None and self._link.is_server

    @property
    def task(self) -> str:
        return self.run.task

    @property
    def traces(self) -> int:
        """Graph tracings on this rank (1 after load, and no more; 0 on a "node" client)."""
        return self._graph.traces if self._graph is not None else 0

    def predict(self, x) -> dict[str, np.ndarray]:
        """Every per-sample quantity ``ensemble.predict`` gives (``predict_arrays``'s keys),
        for this rank's raw features ``x`` (n samples, flat or in the training shape), on this rank."""
        if self.serving:
            raise PredictError("this rank serves its node (placement 'node'); call serve(), not predict()")
        if self.closed:
            raise PredictError("predict() after close(): the in-situ ensemble is closed on this rank")
        t0 = time.perf_counter()
        xn = prepare_features(self.run, x, "the simulation's input", empty=True)   # no rows: an answer of none
        out = self._graph.predict(xn) if self._link is None else self._link.ask(xn)
        self.timings.add(len(xn), time.perf_counter() - t0)
        return out

    def predict_mean_spread(self, x) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) as ``Ensemble.predict`` gives them: probabilities and predictive
        entropy (nats) for classification; mean and standard deviation for regression."""
        out = self.predict(x)
        return (out["proba"], out["total"]) if self.task == "classification" else (out["mean"], out["std"])

    def serve(self):
        """On a serving rank: answer this node's clients until each has closed; its ``ServeStats``."""
        if not self.serving:
            raise PredictError("serve() on a rank that does not serve (placement 'local', or a client)")
        return self._link.serve(self._graph)

    def close(self) -> None:
        """This rank is done asking (a client tells its server); idempotent."""
        if not self.closed and self._link is not None and not self.serving:
            self._link.done()
        self.closed = True

    def close_at_exit(self) -> None:
        """``load`` registers this on a "node" client, to run as the interpreter exits: a client
        whose script ends without ``close()`` left its server in ``serve()``, and the job, for ever."""
        if not self.closed:
            log.warning("in-situ: this rank's script ended without session.close(): closed as Python exits "
                        "(its node's server waits for every client's close)")
            self.close()

    def __enter__(self) -> InSitu:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(run_dir: str | Path, comm=None, placement: str = "local", servers_per_node: int = 1,
         buckets: tuple[int, ...] = BUCKETS, threads: int = 1, batch_wait: float = 0.002) -> InSitu:
    """A finished run's ensemble for in-situ inference; collective over ``comm`` (None: this
    process alone, "local" only). Rank 0 reads the run directory once and broadcasts it; a
    bad run directory or member raises the same ``PredictError`` on every rank (no hang).
    ``buckets``: the padded batch sizes; ``threads``: TensorFlow threads per predicting
    rank; ``batch_wait``: seconds a "node" server waits for more of its clients' requests
    before it runs a batch."""
    from ensemble.inference import insitu_serve as serve
    asked = list(dict.fromkeys(comm.allgather(placement))) if comm is not None else [placement]
    if len(asked) > 1:                         # every rank raises: they would wait in different collectives
        raise PredictError(f"every rank must load with the same placement, but ranks asked for "
                           f"{', '.join(map(repr, asked))}")
    if placement not in PLACEMENTS:
        raise PredictError(f"placement must be one of {', '.join(PLACEMENTS)}, but got {placement!r}")
    if comm is None:
        if placement != "local":
            raise PredictError(f"placement {placement!r} needs an MPI communicator (comm=MPI.COMM_WORLD)")
        run = load_run(run_dir)
        return InSitu(run, placement, None, CombinedGraph(run, buckets, threads))
    run = serve.shared_run(comm, run_dir)
    if placement == "local":
        graph = serve.collective(comm, lambda: CombinedGraph(run, buckets, threads))
        return InSitu(run, placement, comm, graph)
    link = serve.NodeLink.make(comm, servers_per_node, batch_wait)
    graph = serve.collective(comm, lambda: CombinedGraph(run, buckets, threads) if link.is_server else None)
    session = InSitu(run, placement, link.sim_comm, graph, link)
    if not link.is_server:
        atexit.register(session.close_at_exit)
    return session
