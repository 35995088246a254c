"""mode = "pbt": train one member of the population round by round (the worker's side).

A member's spec carries ``pbt``: rounds, epochs per round, its hyperparameters and, on
``--resume``, the round and member whose state it continues from. Each round the member
trains ``round_epochs`` epochs, scores the validation split with the task's metrics,
writes its state (weights and optimizer state, ``RunDirectory.save_state``) and reports;
the master's answer (``ensemble.sources.population``) is one of

- continue (perhaps with ``send_to``: this member's state goes to those ranks),
- update with ``copy``: take the state the donor's rank sends (rebuilding the model first
  when the donor is another architecture), then the new hyperparameters in ``settings``,
- stop: training ends; the member is scored and written as any member is.

Hyperparameters a member exposes: learning_rate and batch_size always, weight_decay (every
Keras optimizer), momentum (optimizers built with a momentum), dropout (models with
Dropout layers: every one gets the rate). A change of dropout, weight decay or momentum
retraces the train step (they are Python constants in it); the learning rate is a
variable and costs nothing. Within a member group every rank takes the same decision and
the leader shares the received state with one broadcast.
"""

from __future__ import annotations

import logging
import time
from typing import Mapping

import numpy as np

from datafeed.pipeline import make_dataset, member_indices
from ensemble.config.schema import PBT_WHAT as WHAT
from ensemble.config.vocabulary import OPTIMIZERS, gaussian_head
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.env import TENSORFLOW
from ensemble.runtime.executor import Report
from ensemble.task import get_task
from ensemble.train.architecture import build_training_state
from ensemble.train.member import MemberFailed, member_record, stop_on_nan, stopping_rows

log = logging.getLogger(__name__)



def _layers(model):
    """Every layer of ``model``, nested ones included."""
    out, todo = [], list(getattr(model, "layers", []))
    while todo:
        layer = todo.pop(0)
        out.append(layer)
        todo.extend(getattr(layer, "layers", []) or [])
    return out


def _dropouts(model):
    import keras
    return [layer for layer in _layers(model) if isinstance(layer, keras.layers.Dropout)]


def exposes(model) -> list[str]:
    """The hyperparameters this member can change between rounds."""
    out = ["learning_rate", "batch_size", "weight_decay"]
    if getattr(model.optimizer, "momentum", 0) not in (None, 0, 0.0):
        out.append("momentum")
    if _dropouts(model):
        out.append("dropout")
    return out


def _optimizer(name: str, hparams: dict):
    import keras
    kwargs = {"learning_rate": float(hparams["learning_rate"])}
    if hparams.get("weight_decay") is not None:
        kwargs["weight_decay"] = float(hparams["weight_decay"])
    cls = getattr(keras.optimizers, OPTIMIZERS[name])
    if hparams.get("momentum") is not None and "momentum" in cls.__init__.__code__.co_varnames:
        kwargs["momentum"] = float(hparams["momentum"])
    return cls(**kwargs)


def state_arrays(model) -> list[np.ndarray]:
    """Weights (moving statistics included; the dropout seed streams left out, so each member
    keeps its own) then the optimizer's variables, built if need be: what a copy moves."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return [np.asarray(v.numpy()) for v in _state_variables(model)]


def _state_variables(model) -> list:
    weights = [v for v in model.weights if "seed_generator" not in v.path]
    return weights + list(model.optimizer.variables)


def reseed(model, seed: int) -> None:
    """Set the model's random streams (its dropout layers' seed generators, which a member's
    state leaves out) from ``seed``: each round starts them afresh, so a member resumed after a
    round draws what the uninterrupted run drew (it drew from its first round's streams)."""
    streams = [v for v in model.variables if "seed_generator" in v.path]
    for i, v in enumerate(streams):
        v.assign(np.array([(seed + 7919 * i) % 2**31, 0], dtype=v.dtype))


def set_state(model, arrays: list[np.ndarray]) -> None:
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    variables = _state_variables(model)
    if len(variables) != len(arrays) or any(tuple(v.shape) != a.shape for v, a in zip(variables, arrays)):
        raise RuntimeError(f"a copied member state ({len(arrays)} arrays) does not fit this model "
                           f"({len(variables)} variables): donor and receiver differ in architecture or optimizer")
    for v, a in zip(variables, arrays):
        v.assign(a)


class PopulationMember:
    """One member's model and hyperparameters on this rank (every rank of its group)."""

    def __init__(self, spec: dict, meta: dict, group=None):
        self.spec, self.meta, self.group = spec, meta, group
        self.task = get_task(meta["task"])
        self.hparams = dict(spec["pbt"]["hparams"])
        self.what = {k: spec.get(k) for k in WHAT}
        self.build(self.what)

    def build(self, what: dict) -> None:
        """(Re)build and compile the model ``what`` describes, with the current hyperparameters."""
        from ensemble.train.architecture import build_model, use_builder_folders
        use_builder_folders([what])
        self.what = dict(what)
        self.gaussian = gaussian_head(what.get("loss"), self.task.name, bool(what.get("model")))
        model = build_model(what, tuple(self.meta["input_shape"]), self.meta["n_outputs"], self.task.name)
        loss, metrics = self.task.loss(self.gaussian)
        model.compile(optimizer=_optimizer(what["optimizer"], self.hparams), loss=loss, metrics=metrics,
                      jit_compile=TENSORFLOW["jit_compile"])
        self.parallel = []
        if self.group is not None:
            from ensemble.runtime.data_parallel import broadcast_weights, make_data_parallel
            broadcast_weights(model, self.group)
            self.parallel = make_data_parallel(model, self.group)
        self.model = model
        self._set_dropout(self.hparams.get("dropout"))

    def _set_dropout(self, rate) -> bool:
        if rate is None:
            return False
        changed = False
        for layer in _dropouts(self.model):
            if layer.rate != float(rate):
                layer.rate, changed = float(rate), True
        return changed

    def current(self) -> dict:
        """The hyperparameters as the member trains with them now: a setting left unset in the
        config (None) reads as the layer's or optimizer's own value."""
        opt, now = self.model.optimizer, dict(self.hparams)
        now["learning_rate"] = float(np.asarray(opt.learning_rate))
        dropouts = _dropouts(self.model)
        if now.get("dropout") is None and dropouts:
            now["dropout"] = float(dropouts[0].rate)
        if now.get("weight_decay") is None and getattr(opt, "weight_decay", None):
            now["weight_decay"] = float(opt.weight_decay)
        if now.get("momentum") is None and "momentum" in exposes(self.model):
            now["momentum"] = float(opt.momentum)
        return now

    def apply(self, hparams: dict) -> None:
        """Train with ``hparams`` from now on; retrace the train step if a constant in it changed."""
        opt = self.model.optimizer
        opt.learning_rate.assign(float(hparams["learning_rate"]))
        retrace = self._set_dropout(hparams.get("dropout"))
        if hparams.get("weight_decay") is not None and opt.weight_decay != float(hparams["weight_decay"]):
            opt.weight_decay, retrace = float(hparams["weight_decay"]), True
        if (hparams.get("momentum") is not None and "momentum" in exposes(self.model)
                and opt.momentum != float(hparams["momentum"])):
            opt.momentum, retrace = float(hparams["momentum"]), True
        if retrace:
            self.model.train_function = None
        self.hparams = dict(hparams)

    def take(self, what: dict, arrays: list[np.ndarray], hparams: dict) -> None:
        """Become a copy of another member: its architecture (rebuilt if it differs), its state,
        then ``hparams``."""
        if what != self.what:
            self.hparams = dict(hparams)
            self.build(what)
        set_state(self.model, arrays)
        self.apply(hparams)


def train_population_member(spec: dict, data: Mapping[str, np.ndarray], meta: dict, run_dir: RunDirectory,
                            comm, group=None, report: Report | None = None, max_sleep: float = 0.05) -> dict | None:
    """Train one population member for every round the master allows; return its record
    (None on a group rank that is not the leader). ``comm``: the world communicator the
    members' states travel on."""
    import keras

    from ensemble.runtime.exchange import recv_state, send_state, share_in_group, state_bytes

    t0 = time.monotonic()
    pbt = spec["pbt"]
    leader = group is None or group.Get_rank() == 0
    rank = comm.Get_rank() if comm is not None else 0
    keras.utils.set_random_seed(spec["seed"])
    member = PopulationMember(spec, meta, group)
    build_seconds = time.monotonic() - t0
    first, stopped = 1, False
    restore = pbt.get("restore")
    if restore:                                  # --resume: the state this member had after that round
        arrays, info = run_dir.load_state(restore["from"], restore["round"])
        member.take(info["what"], arrays, pbt["hparams"])
        first, stopped = restore["round"] + 1, bool(restore.get("stop"))
        log.debug("%s: continues after round %d from %s", spec["id"], restore["round"], restore["from"])
    task, model_y = member.task, np.asarray(data["y_train"])
    y_shift, y_scale = task.target_scaling(model_y)
    y_tf = task.target_transform(y_shift, y_scale)
    idx = member_indices(len(model_y), spec["seed"], spec.get("bootstrap", False))
    shard = (group.Get_rank(), group.Get_size()) if group is not None and group.Get_size() > 1 else None
    epochs, bytes_sent, bytes_received, copies = 0, 0, 0, []
    for round_ in range(first, pbt["rounds"] + 1):
        if stopped:
            break
        t_round = time.monotonic()
        # every round from its own seed: a member resumed after round k trains round k + 1 with
        # the random numbers (its dropout masks) the uninterrupted run used
        reseed(member.model, (spec["seed"] + 104729 * round_) % 2**31)
        E = pbt["round_epochs"]
        train_ds = make_dataset(data["x_train"], model_y, idx, int(member.hparams["batch_size"]),
                                (spec["seed"] + 7919 * round_) % 2**31, y_transform=y_tf, shard=shard)
        build_training_state(member.model, train_ds)       # a new model's step traced once (no-op after)
        hist = member.model.fit(train_ds, epochs=round_ * E, initial_epoch=(round_ - 1) * E, verbose=0,
                                shuffle=False, callbacks=member.parallel[:1] + [stop_on_nan()]
                                + member.parallel[1:]).history
        losses = np.asarray(hist.get("loss", []), dtype=np.float64)
        epochs = round_ * E
        ok = bool(len(losses) and np.isfinite(losses).all())
        payload = {"round": round_, "ok": ok, "loss": float(losses[-1]) if len(losses) else None, "rank": rank,
                   "exposes": exposes(member.model), "hparams": member.current()}
        arrays = None
        if leader:
            val = None
            if ok:                                 # scored on the rows a member stops on: not the ones
                rows = stopping_rows(data, meta)   # data.calibration_holdout keeps for the recalibration
                pred, var = task.predict(member.model, np.asarray(data["x_val"])[rows], y_shift, y_scale,
                                         member.gaussian)
                if np.isfinite(pred).all():
                    val = task.metrics(np.asarray(data["y_val"])[rows], pred, var)
                else:
                    ok = False
            arrays = state_arrays(member.model)
            run_dir.save_state(spec["id"], round_, arrays, {"what": member.what, "hparams": member.hparams})
            payload.update(ok=ok, val=val, state_bytes=state_bytes(arrays),
                           seconds=round(time.monotonic() - t_round, 3))
        decision = report(payload) if report is not None else {"action": "continue"}
        if decision["action"] == "stop":
            break
        if decision.get("send_to") and leader:
            bytes_sent += send_state(comm, arrays, [int(r) for r in decision["send_to"]], max_sleep)
        copy = decision.get("copy")
        if copy:
            got = None
            if leader:
                got, n = recv_state(comm, int(copy["rank"]), max_sleep)
                bytes_received += n
            got = share_in_group(group if shard else None, got, max_sleep)
            member.take(copy["what"], got, decision["settings"])
            copies.append({"round": round_, "from": copy["member"]})
        elif decision["action"] == "update":
            member.apply(decision["settings"])
    if not leader:
        return None
    try:                                      # scored and written as any member ends (member_record)
        result = member_record(spec, member.model, data, run_dir, task, member.gaussian, y_shift, y_scale, {},
                               epochs, t0, build_seconds, "pbt")
    except MemberFailed as exc:
        raise MemberFailed(exc.kind, f"{exc} after {epochs} epochs; lower `pbt.ranges.learning_rate`") from None
    result["arch"] = member.what.get("arch")      # a member that copied another took its architecture
    result["exchange"] = {"bytes_sent": bytes_sent, "bytes_received": bytes_received, "copies": copies,
                          "hparams": member.hparams, "arch_now": member.what.get("arch")}
    return result
