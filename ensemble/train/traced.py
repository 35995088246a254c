"""Members of one architecture reuse the traced training step on a worker
(``runtime.traced_models``).

Keras traces a compiled model's train and test steps into TensorFlow graphs on its first
``fit``: for the small networks of a search or an ensemble that costs 1-2 s, as long as ten
or more of their epochs, and every new model pays it again. The next member of the same
architecture on the same worker needs exactly the same graphs, only other numbers in them.
So a worker keeps its last few compiled models, keyed by everything a traced step depends
on (the layers, the input and output shapes, the task and its loss, the optimizer, the
precision and XLA setting), and trains the next member of a key on the kept
model after loading that member's own starting state into it: the weights, Batch
Normalization statistics and dropout seed streams of a model freshly built with the
member's seed (and inherited weights, if any), and the state of a fresh optimizer
(iterations, learning rate, moments): members that differ only in learning rate or batch
size (a search's mutations often do) share a kept model too. Nothing else persists between members (callbacks,
datasets, metrics are made per ``fit``), so the member ends bit for bit as it would on a
fresh model (``tests/ensemble/test_traced.py``); its fresh model is built anyway (0.05-0.1 s)
because its initial state is the member's definition.

Not reused: a user's model builder (``model = "package.module:function"``: its layers may
keep Python state no variable holds), members of a group (the data-parallel step wraps the
model) and packed members (their own graph). ``traced_models = 0`` turns it off; each kept
model holds its weights and optimizer state in memory (three copies of its parameters), so
lower it for models near the device's memory.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Any

log = logging.getLogger(__name__)

#: the spec's settings a traced step depends on; the rest only feed callbacks (epochs, patience,
#: time limit, reports), data (seed, bootstrap, batch size: a batch's length is not part of the
#: trace) and starting state (seed, inheritance, learning rate: an optimizer variable)
TRACED_SETTINGS = ("layers", "optimizer", "loss")


def trace_key(spec: dict, meta: dict, gaussian: bool, tensorflow: dict, group: Any = None) -> str | None:
    """What a member's traced steps depend on, as a string; None when it must not reuse any."""
    if group is not None or spec.get("model") or not spec.get("layers"):
        return None
    return json.dumps({"spec": {k: spec.get(k) for k in TRACED_SETTINGS}, "gaussian": gaussian,
                       "task": meta["task"], "input_shape": list(meta["input_shape"]),
                       "n_outputs": meta["n_outputs"],
                       "tf": {k: tensorflow.get(k) for k in ("precision", "jit_compile")}},
                      sort_keys=True, default=str)


def _signature(variables) -> list[tuple]:
    return [(tuple(v.shape), str(v.dtype)) for v in variables]


class TracedModels:
    """This process's compiled models, at most ``size``, the least recently used dropped
    first. ``take`` hands one out (it leaves the cache while a member trains on it: a member
    that fails mid-way leaves nothing half-trained behind); ``keep`` puts it back."""

    def __init__(self, size: int = 0):
        self.size = size
        self._models: OrderedDict[str, Any] = OrderedDict()
        self.reused = 0

    def __len__(self) -> int:
        return len(self._models)

    def take(self, key: str | None):
        if key is None or not self.size:
            return None
        return self._models.pop(key, None)

    def keep(self, key: str | None, model) -> None:
        if key is None or not self.size:
            return
        self._models[key] = model
        self._models.move_to_end(key)
        while len(self._models) > self.size:
            self._models.popitem(last=False)

    def clear(self) -> None:
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


#: this process's kept models; ``runtime.env.configure_tensorflow`` sets its size
TRACED = TracedModels()
