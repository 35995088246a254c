"""mode = "online": members train while a simulation runs beside them, in one MPMD job.

``mpirun -n S python sim.py : -n E python -m ensemble.run config.toml``: the two programs
find each other through MPI alone (``runtime.mpi.app_world``: ``COMM_WORLD`` split by
application number, an intercommunicator between the leaders). The ensemble program is a
normal run on its own ranks; only its master talks to the simulation (``runtime.coupling``).

Before the run directory is made (``before_prepare``, rank 0): the first ``online.warmup``
samples are written to ``data.source``, so that the run's split, normalisation and fixed
validation and test rows come from them, as from any data file (an existing file is used
as it is: an earlier simulation's samples, or the same file when resuming). Then the Source
(``sources.online.OnlineSource``) hands out members that train on snapshots of the replay
buffer (``OnlineTrainer``), and publishes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ensemble.config import ConfigError, Problems, RunConfig
from ensemble.modes.base import Mode, RunContext
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.executor import OneByOne, Trainer
from ensemble.sources.base import Decider, GoOn, Source

log = logging.getLogger(__name__)

#: rank 0's link to the simulation, made before the run directory (``before_prepare``), used by ``make``
_LINK: dict[str, Any] = {}

#: seconds between two lines saying how many warm-up samples have arrived
WARMUP_NOTE_SECONDS = 10.0


def needs_simulation() -> str:
    return ('mode "online" trains on samples a running simulation streams: start it as the second program '
            "of one MPMD job, `mpirun -n S python sim.py : -n E python -m ensemble.run config.toml`, with the "
            "simulation calling `ensemble.inference.online.connect()`")


class OnlineMode(Mode):
    name = "online"
    tables = ("online",)
    takes_helpers = False              # the data keeps coming: no last members
    one_shot_members = False           # no list of members: they come as long as the simulation runs
    writes_source = True               # the first `online.warmup` samples, unless it exists

    def before_prepare(self, cfg: RunConfig, args: Any) -> None:
        """Rank 0, before the data is read: link to the simulation, start receiving, and write
        the first ``online.warmup`` samples to ``data.source`` unless it exists."""
        from ensemble.runtime import mpi
        from ensemble.runtime.coupling import Inlet
        from ensemble.sources.replay import ReplayBuffer
        inter = mpi.peer()
        if inter is None:
            raise ConfigError(needs_simulation())
        on = cfg.online
        buffer = ReplayBuffer(on.buffer, on.policy, on.when_behind, on.max_unseen or None, cfg.seed)
        inlet = _LINK.get("inlet") or Inlet(inter, lambda rank, seq, x, y: buffer.offer(x, y, rank, seq))
        _LINK.update(inlet=inlet, buffer=buffer)
        source = Path(cfg.data.source)
        if source.exists():
            log.info(f"online: {source} exists; its samples give the run's split and normalisation")
            return
        want = min(on.warmup, on.buffer)
        log.info(f"online: waiting for {want} samples from the simulation ({inlet.ranks} ranks) for {source}")
        noted = time.monotonic()
        while True:
            with inlet.lock:
                if buffer.size >= want:
                    snap = buffer.snapshot()
                    break
                if inlet.closed.is_set():
                    refused = (f" ({inlet.refused} more were refused: {inlet.refused_error})"
                               if inlet.refused else "")
                    raise ConfigError(f"the simulation closed after sending {buffer.size} usable samples{refused}, "
                                      f"fewer than `online.warmup` = {on.warmup}: lower it, or let the simulation "
                                      "send more")
            if time.monotonic() - noted > WARMUP_NOTE_SECONDS:
                log.info(f"online: {buffer.size} of {want} warm-up samples so far")
                noted = time.monotonic()
            time.sleep(0.02)
        from ensemble.results.rundir import atomic_write
        source.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(source, lambda p: np.savez(p, x=snap["x"], y=snap["y"]))
        log.info(f"online: wrote the first {len(snap['x'])} samples to {source}")

    def selection_pool(self, cfg: RunConfig, records: list) -> frozenset[str] | None:
        from ensemble.sources.online import ok_members, window_of
        return window_of(ok_members(records), cfg.online.window)   # the newest, as each publication chose

    def abandon(self, reason: str) -> None:
        inlet, why = _LINK.get("inlet"), f"before training: {reason}"
        if inlet is not None:
            inlet.stop(why)
            return
        from ensemble.runtime import mpi
        from ensemble.runtime.coupling import tell_ended
        inter = mpi.peer()                       # before the link's thread: a config the job refused at once
        if inter is not None:
            tell_ended(inter, range(inter.Get_remote_size()), why)

    def make(self, ctx: RunContext) -> tuple[Source, Decider]:
        from ensemble.sources.online import OnlineSource, snapshot_files
        if "inlet" not in _LINK:
            raise ConfigError(needs_simulation())
        inlet, buffer = _LINK["inlet"], _LINK["buffer"]
        run_dir = ctx.run_dir
        previous = [x for x in ctx.history if isinstance(x, MemberRecord)]
        snaps = snapshot_files(run_dir)
        if previous and snaps:                          # --resume: the buffer as the last job left it, then
            with np.load(snaps[-1]) as saved, inlet.lock:   # what arrived since this job began
                now = buffer.snapshot() if buffer.size else None
                buffer.restore(dict(saved))
                if now is not None:
                    buffer.offer(now["x"], now["y"])
            log.info(f"online: resumed the replay buffer from {snaps[-1].name} ({buffer.size} samples)")
        generation = 0
        published = run_dir.path / run_dir.ENSEMBLE
        if previous and published.exists():
            import json
            generation = int((json.loads(published.read_text()).get("online") or {}).get("generation", 0))
        return OnlineSource(ctx.cfg, run_dir, inlet, buffer, previous, generation, ctx.workers), GoOn()

    def expected_members(self, cfg: RunConfig, workers: int | None = None) -> int | None:
        return None                                     # as many as the simulation's time allows

    def describe(self, cfg: RunConfig) -> str:
        on = cfg.online
        return (f"{len(cfg.architectures)} architecture(s), trained online on a {on.policy} buffer of {on.buffer} "
                f"samples, published every {on.publish_every} members")

    def preflight(self, cfg: RunConfig, meta: dict | None, groups: int | None, found: Problems,
                  resumed: RunDirectory | None = None) -> None:
        if not cfg.data.source.endswith(".npz"):
            found.add(f"mode \"online\" writes its first samples to `data.source` (an .npz file), but got "
                      f"{cfg.data.source!r}: name an .npz file", "data.source")
        task = meta["task"] if meta is not None else None if cfg.data.task == "auto" else cfg.data.task
        if task not in (None, "regression"):          # a task set in the config: said before the warm-up
            found.add("mode \"online\" trains regression ensembles (the simulation's targets are numbers); "
                      + (f"the samples make a {task} task" if meta is not None else
                         f"`data.task` is {task!r}: leave it at \"auto\" or set \"regression\""), "data.task")
        if cfg.runtime.trainer == "rehearsal":
            found.add("mode \"online\" trains real members on the simulation's samples; use `runtime.trainer = "
                      "\"keras\"`", "runtime.trainer")

    def keras_trainer(self, cfg: RunConfig, meta: dict, data: Any, run_dir: RunDirectory, rank: int,
                      group: Any = None, comm: Any = None) -> Trainer:
        return OneByOne(OnlineTrainer(data, meta, run_dir, rank, group))

    def launch(self, config_path: str) -> str:
        return f"mpirun -n S python sim.py : -n E python -m ensemble.run {config_path}"

    def ranks_hint(self, cfg: RunConfig) -> str:
        return "; run it beside a simulation: " + self.launch("CONFIG")


class OnlineTrainer:
    """A member on the buffer snapshot its spec names (``spec["online"]["buffer"]``), in place
    of the run's training rows; validation and test rows stay the run's own."""

    def __init__(self, data: Any, meta: dict, run_dir: RunDirectory, rank: int, group: Any = None):
        self.data, self.meta, self.run_dir, self.rank, self.group = data, meta, run_dir, rank, group
        self._cached: tuple[str, dict] | None = None

    def arrays(self, spec: dict) -> dict:
        """The run's arrays with the training rows of the snapshot, normalised as the run's."""
        name = spec["online"]["buffer"]
        if self._cached is None or self._cached[0] != name:
            from datafeed.prepare import apply_normalizer
            with np.load(self.run_dir.path / name) as snap:
                x, y = snap["x"], snap["y"]
            shift, scale = np.asarray(self.data["x_mean"]), np.asarray(self.data["x_scale"])
            x = apply_normalizer(x.reshape((len(x), *shift.shape)), shift, scale)
            self._cached = (name, {"x_train": x, "y_train": np.asarray(y, np.float32)})
        return {**self.data, **self._cached[1]}

    def __call__(self, spec: dict, report: Any) -> dict | None:
        from ensemble.train.member import guarded, train_member
        return guarded(lambda: train_member(spec, self.arrays(spec), self.meta, self.run_dir, self.group, report),
                       spec, self.rank)
