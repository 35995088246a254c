"""Members of one architecture reuse the traced training step on a worker
(``runtime.traced_models``), and the next member's steps may be traced ahead
(``runtime.pretrace``).

Keras traces a compiled model's train and test steps into TensorFlow graphs on its first
``fit``: for the small networks of a search or an ensemble that costs 1-2 s, as long as ten
or more of their epochs, and every new model pays it again. The next member of the same
architecture on the same worker needs exactly the same graphs, only other numbers in them.
So a worker keeps its last few compiled models, keyed by everything a traced step depends
on (the layers, the input and output shapes, the task and its loss, the optimizer class,
the precision and XLA setting), and trains the next member of a key on the kept model
after loading that member's own starting state into it: the weights, Batch Normalization
statistics and dropout seed streams of a model freshly built with the member's seed (and
inherited weights, if any), and the state of a fresh optimizer (iterations, learning rate,
moments). Members that differ only in learning rate or batch size (a search's mutations
often do) share a kept model too. Nothing else persists between members (callbacks,
datasets, metrics are made per ``fit``), so the member ends bit for bit as it would on a
fresh model (``tests/ensemble/test_traced.py``); its fresh model is built anyway (0.05-0.1 s)
because its initial state is the member's definition.

Traced ahead: while a worker trains one member, a background thread builds the next spec
it holds (sent ahead by the master) and runs one training and one validation batch
through it, so that its model is kept, traced, when that member starts. Tracing is Python
on the host: it overlaps the member's training best where the node has a core to spare
beside each worker (GPU nodes); it is off unless set (not measured on GPUs, where the
background model takes device memory). Both threads build models under ``BUILD_LOCK``:
a member's seeded build draws from Python's and NumPy's global generators, which a build
in the other thread must not interleave with.

Not reused: a user's model builder (``model = "package.module:function"``: its layers may
keep Python state no variable holds), members of a group (the data-parallel step wraps the
model) and packed members (their own graph). ``traced_models = 0`` turns it off. Each kept
model holds its weights and optimizer state in (device) memory, so a model whose variables
take more than ``KEEP_BYTES`` is not kept: tracing is a large share of a member's time only
for small networks, and a large one must not hold a second copy's memory between members.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any, Mapping

log = logging.getLogger(__name__)

#: held while a model is built (a member's seeded build, a background one)
BUILD_LOCK = threading.Lock()
#: a model whose variables and optimizer state take more bytes is not kept (about 20 million
#: parameters with Adam)
KEEP_BYTES = 256 * 2**20

#: the spec's settings a traced step depends on; the rest only feed callbacks (epochs, patience,
#: time limit, reports), data (seed, bootstrap, batch size: a batch's length is not part of the
#: trace) and starting state (seed, inheritance, learning rate: an optimizer variable)
TRACED_SETTINGS = ("layers", "optimizer", "loss")


def trace_key(spec: dict, meta: Mapping[str, Any], tensorflow: Mapping[str, Any], group: Any = None) -> str | None:
    """What a member's traced steps depend on, as a string; None when it must not reuse any.
    (Its Gaussian head or not follows from the loss and the task, both in the key.)"""
    if group is not None or spec.get("model") or not spec.get("layers"):
        return None
    return json.dumps({"spec": {k: spec.get(k) for k in TRACED_SETTINGS},
                       "task": meta["task"], "input_shape": list(meta["input_shape"]),
                       "n_outputs": meta["n_outputs"],
                       "tf": {k: tensorflow.get(k) for k in ("precision", "jit_compile")}},
                      sort_keys=True, default=str)


def variable_bytes(model) -> int:
    """Bytes of a compiled model's variables and its optimizer's."""
    import numpy as np
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])
    return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in variables)


def _signature(variables) -> list[tuple]:
    return [(tuple(v.shape), str(v.dtype)) for v in variables]


class TracedModels:
    """This process's compiled models, at most ``size``, the least recently used dropped
    first. ``take`` hands one out (it leaves the cache while a member trains on it: a member
    that fails mid-way leaves nothing half-trained behind); ``keep`` puts it back."""

    def __init__(self, size: int = 0):
        self.size = size
        self._models: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()           # the member's thread and a pretrace thread

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, key: str | None) -> bool:
        return key in self._models

    def take(self, key: str | None):
        if key is None or not self.size:
            return None
        with self._lock:
            return self._models.pop(key, None)

    def keep(self, key: str | None, model) -> None:
        if key is None or not self.size or variable_bytes(model) > KEEP_BYTES:
            return
        with self._lock:
            self._models[key] = model
            self._models.move_to_end(key)
            while len(self._models) > self.size:
                self._models.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._models.clear()


def adopt(kept, fresh, optimizer) -> bool:
    """Load ``fresh``'s state (a model built for the next member, not compiled) and the
    state of ``optimizer`` (a fresh one for it, not built yet) into the compiled ``kept``
    model; False (nothing changed) when their variables do not match one for one."""
    import keras
    scaled = keras.optimizers.LossScaleOptimizer
    if isinstance(kept.optimizer, scaled) and not isinstance(optimizer, scaled):
        optimizer = scaled(optimizer, name="loss_scale_optimizer")     # what compile wraps it in
    optimizer.build(fresh.trainable_variables)
    pairs = [(kept.variables, fresh.variables), (kept.optimizer.variables, optimizer.variables)]
    if (type(kept.optimizer) is not type(optimizer)
            or any(_signature(a) != _signature(b) for a, b in pairs)):
        log.debug("a kept model's variables differ from the new member's: building anew")
        return False
    for dst, src in pairs:
        for d, s in zip(dst, src):
            d.assign(s.value)
    return True


#: this process's kept models; ``train.member`` sizes it from ``runtime.traced_models``
TRACED = TracedModels()


class Pretracer:
    """Traces one upcoming member's steps at a time in a background thread, into ``TRACED``."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._key: str | None = None
        self.traced = 0                     # donors kept, for the tests and the benchmark

    def start(self, upcoming: dict, now: dict, data: Mapping[str, Any], meta: Mapping[str, Any],
              tensorflow: Mapping[str, Any]) -> bool:
        """Trace ``upcoming`` in the background unless its steps are kept already, are those of
        ``now`` (traced by its own member in a moment), or another trace still runs. Streamed
        data is left alone (a batch would read the files twice)."""
        TRACED.size = tensorflow["traced_models"]
        if not TRACED.size or meta.get("stream") or (self._thread is not None and self._thread.is_alive()):
            return False
        key = trace_key(upcoming, meta, tensorflow)
        if key is None or key in TRACED or key == trace_key(now, meta, tensorflow):
            return False
        self._key = key
        self._thread = threading.Thread(target=self._trace, args=(key, upcoming, data, meta, dict(tensorflow)),
                                        name="pretrace", daemon=True)
        self._thread.start()
        return True

    def wait(self, key: str | None) -> None:
        """Let a trace of ``key`` that is running end first (a member about to train it)."""
        thread = self._thread
        if key is not None and key == self._key and thread is not None:
            thread.join()

    def _trace(self, key: str, spec: dict, data: Mapping[str, Any], meta: Mapping[str, Any],
               tensorflow: dict) -> None:
        try:
            import keras

            from ensemble.config.vocabulary import gaussian_head
            from ensemble.task import get_task
            from ensemble.train.architecture import build_model, build_training_state, make_optimizer
            from ensemble.train.member import member_datasets
            keras.mixed_precision.set_global_policy(tensorflow["precision"])   # Keras' settings are per thread
            task = get_task(meta["task"])
            gaussian = gaussian_head(spec.get("loss"), task.name, False)     # a user's builder is never traced ahead
            with BUILD_LOCK:
                model = build_model(spec, tuple(meta["input_shape"]), meta["n_outputs"], task.name)
            loss, metrics = task.loss(gaussian)
            model.compile(optimizer=make_optimizer(spec["optimizer"], spec["learning_rate"]), loss=loss,
                          metrics=metrics, jit_compile=tensorflow["jit_compile"])
            y_tf = task.target_transform(*task.target_scaling(data["y_train"]))
            train_ds, val_ds = member_datasets(spec, data, dict(meta), y_tf)
            build_training_state(model, train_ds)
            model.fit(train_ds.take(1), validation_data=val_ds.take(1), epochs=1, verbose=0)
            TRACED.keep(key, model)
            self.traced += 1
        except Exception as exc:  # noqa: BLE001 - the member traces its own steps instead
            log.debug("tracing %s ahead failed: %s: %s", spec.get("id"), type(exc).__name__, exc)


#: this process's background tracer (``runtime.pretrace``)
PRETRACE = Pretracer()
