"""mode "online": the Source of members that train while a simulation streams samples.

Samples arrive on the master's ``runtime.coupling.Inlet`` (a thread) into a ``ReplayBuffer``.
Each spec names a snapshot of the buffer, written to ``<run>/online/buffer-NNNNN.npz``
(raw ``x``, ``y`` and each sample's origin), so workers read it as they read any run file
and a resumed run starts from the last one. Every ``online.publish_every`` members that
finish ok, the session's ``Hooks.publish`` writes ``ensemble.json`` as at the end of a run
(selection over every member so far), and the simulation's ranks are told its generation.
When the simulation has closed, a last round (one member per worker) trains on the final
buffer, nothing more is handed out, and the session's end publishes once more.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ensemble.config import RunConfig
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.runtime.coupling import Inlet
from ensemble.sources.base import Hooks
from ensemble.sources.members import arch_specs, derive_seed
from ensemble.sources.replay import ReplayBuffer, newest

log = logging.getLogger(__name__)

SNAPSHOTS = "online"            # the run directory's folder of buffer snapshots
PREFIX = "buffer-"


def snapshot_files(run_dir: RunDirectory) -> list[Path]:
    """The buffer snapshots a run directory holds, oldest first."""
    return sorted((run_dir.path / SNAPSHOTS).glob(f"{PREFIX}*.npz"))


def member_number(member_id: str) -> int | None:
    """n of an online member's id ``o-NNNNN``."""
    head, _, tail = member_id.partition("-")
    return int(tail) if head == "o" and tail.isdigit() else None


def ok_members(records) -> list[str]:
    """The online members of ``records`` that finished ok, oldest first (by their number)."""
    return sorted(r.id for r in records if r.ok and member_number(r.id) is not None)


def window_of(ok: list[str], window: int) -> frozenset[str] | None:
    """The members an online ensemble selects among: the newest ``window`` (``online.window``) of
    ``ok`` (oldest first); None: every one (window 0)."""
    return frozenset(ok[-window:]) if window else None


class OnlineSource:
    """Specs that train on the replay buffer as it is now; publishes every ``publish_every``
    members that finished ok. Both ``inlet`` and ``buffer`` are shared with the inlet's
    thread: touched under ``inlet.lock``."""

    total = None

    def __init__(self, cfg: RunConfig, run_dir: RunDirectory, inlet: Inlet, buffer: ReplayBuffer,
                 previous: list[MemberRecord], generation: int = 0, workers: int = 1, poll: float = 0.02):
        self.workers = max(1, workers)
        self.final_left: int | None = None       # the last round, once the simulation has closed
        self.cfg, self.run_dir, self.inlet, self.buffer, self.poll = cfg, run_dir, inlet, buffer, poll
        numbers = [member_number(r.id) for r in previous]
        self.next_number = 1 + max((n for n in numbers if n is not None), default=-1)
        self.snap_number = 1 + max((int(p.stem[len(PREFIX):]) for p in snapshot_files(run_dir)), default=-1)
        self.generation = generation
        self.hooks: Hooks | None = None
        self.ok_since = 0
        self.due = False
        self.failed_members = 0
        self.failed_publishes = 0
        self.published: list[dict] = []
        self._snap: tuple[int, str, dict[int, int]] | None = None   # (buffer version, file, newest seqs)
        self._trained_on: dict[str, dict[int, int]] = {}            # member id -> newest seqs it saw
        self._files_in_use: dict[str, str] = {}                      # member in training -> its snapshot
        self._ok = ok_members(previous)

    def bind(self, hooks: Hooks) -> None:
        self.hooks = hooks

    # -- what to train next -------------------------------------------------------------------
    def next_spec(self) -> dict | None:
        if self.due:
            self.publish()
        while True:
            with self.inlet.lock:
                if self.inlet.closed.is_set():           # the simulation is done: a last round on the
                    if self.final_left is None:          # final buffer, one member per worker, then none
                        self.final_left = self.workers if self.buffer.size else 0
                    if self.final_left <= 0:
                        if self.ok_since:                # the last round, published before the end
                            self.publish()
                        return None
                    self.final_left -= 1
                    return self._spec()
                if self.buffer.size >= min(self.cfg.online.warmup, self.buffer.capacity):
                    return self._spec()
            time.sleep(self.poll)                         # only before the buffer first fills

    def _spec(self) -> dict:
        """A member on the buffer as it is (a new snapshot file if it changed); under the lock."""
        if self._snap is None or self._snap[0] != self.buffer.version:
            snap = self.buffer.snapshot()
            name = f"{SNAPSHOTS}/{PREFIX}{self.snap_number:05d}.npz"
            (self.run_dir.path / SNAPSHOTS).mkdir(exist_ok=True)
            self.run_dir.write_npz(name, **snap)
            self.snap_number += 1
            self._snap = (self.buffer.version, name, newest(snap))
            self._prune_files()
        _, name, seqs = self._snap
        n, archs = self.next_number, self.cfg.architectures
        self.next_number += 1
        a = n % len(archs)
        spec = dict(next(arch_specs(self.cfg.replace(architectures=(archs[a].replace(members=1),)), 0)))
        spec.update(id=f"o-{n:05d}", seed=derive_seed(self.cfg.seed, a, n),
                    online={"buffer": name, "samples": int(self.buffer.size), "generation": self.generation})
        self._trained_on[spec["id"]] = seqs
        self._files_in_use[spec["id"]] = name
        return spec

    def _prune_files(self) -> None:
        """Snapshots no member in training needs and that are not the newest go."""
        keep = set(self._files_in_use.values()) | ({self._snap[1]} if self._snap else set())
        for path in snapshot_files(self.run_dir):
            if f"{SNAPSHOTS}/{path.name}" not in keep:
                path.unlink(missing_ok=True)

    # -- what ended ----------------------------------------------------------------------------
    def dry(self) -> bool:
        return False                     # its members train in rounds (or on new data): none is the last

    def tell(self, record: MemberRecord) -> MemberRecord:
        self._files_in_use.pop(record.id, None)
        if record.ok:
            self._ok.append(record.id)
            self.ok_since += 1
            self.due = self.ok_since >= self.cfg.online.publish_every
        else:
            self.failed_members += 1
            log.warning(f"online: member {record.id} {record.status.value}"
                        + (f" ({record.error_kind}: {record.error_message})" if record.error else "")
                        + f"; the simulation keeps generation {self.generation}")
        return record

    def publish(self) -> dict | None:
        """Select and write ``ensemble.json`` now (``Hooks.publish``) and tell the simulation;
        a failure is logged and said to the simulation, which keeps the last ensemble."""
        self.due, self.ok_since = False, 0
        if self.hooks is None or self.hooks.publish is None:     # a session that cannot publish mid-run
            return None
        generation = self.generation + 1
        t0 = time.time()
        try:
            summary = self.hooks.publish({"online": self.section(generation)}, among=self.window())
        except Exception as exc:                      # noqa: BLE001 - a publish must not stop training
            self.failed_publishes += 1
            log.error(f"online: publishing generation {generation} failed ({type(exc).__name__}: {exc}); the "
                      f"simulation keeps generation {self.generation}")
            self.inlet.failed(generation, f"{type(exc).__name__}: {exc}")
            return None
        members = [m["id"] for m in summary.get("members", [])]
        seqs: dict[int, int] = {}
        for m in members:
            for rank, seq in self._trained_on.get(m, {}).items():
                seqs[rank] = max(seq, seqs.get(rank, -1))
        self.generation = generation
        self.inlet.announce(generation, str(self.run_dir.path), seqs)
        self.published.append({"generation": generation, "members": len(members), "at": round(t0, 3),
                               "seconds": round(time.time() - t0, 3)})
        log.info(f"online: generation {generation} published ({len(members)} members, "
                 f"{self.buffer.counts.offered} samples received, {time.time() - t0:.2f} s)")
        return summary

    def window(self) -> frozenset[str] | None:
        """The members a publication selects among: the newest ``online.window`` that finished ok."""
        return window_of(self._ok, self.cfg.online.window)

    def section(self, generation: int) -> dict[str, Any]:
        """ensemble.json's "online" section."""
        c = self.buffer.counts
        return {"generation": generation, "samples_received": c.offered, "samples_taken": c.taken,
                "samples_dropped": c.dropped, "buffer": self.buffer.size, "policy": self.buffer.policy,
                "members_failed": self.failed_members, "publishes_failed": self.failed_publishes,
                "simulation": {str(k): v for k, v in sorted(self.inlet.sim_counts.items())},
                "simulation_closed": self.inlet.closed.is_set(),
                **({"samples_refused": self.inlet.refused, "refused_because": self.inlet.refused_error}
                   if self.inlet.refused else {}),
                **({"link_error": f"{type(self.inlet.error).__name__}: {self.inlet.error}"}
                   if self.inlet.error is not None else {})}

    def finish(self, records: list[MemberRecord]) -> dict[str, Any]:
        """The run's end: the last publication is the session's own ensemble.json."""
        if not self.inlet.closed.is_set():
            self.inlet.stop("the ensemble's run ended (its budget, or an error) while the simulation streamed")
        else:
            self.inlet.stop()
        final = self.section(self.generation + (1 if self.ok_since else 0))
        final["published"] = self.published
        return {"online": final}
