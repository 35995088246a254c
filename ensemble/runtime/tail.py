"""The end of the run: idle workers join the members still training (``runtime.tail_helpers``).

Once the master has nothing more to hand out (the member list is dry, the search's budget
spent, the budget's stop rule hit), every worker that goes idle would wait for the last,
longest members. Instead the master sends it to help one of them: the member that has
trained longest (the master knows elapsed times, not durations) and has room, up to
``tail_helpers`` helpers a member. At its next epoch end the member's worker (the leader)
forms a data-parallel group with its helpers, gives them its state (weights, optimizer
state, epoch, early-stopping counters, elapsed time) and goes on training with the group,
each rank on its shard of every global batch (``runtime.data_parallel``). A group can grow
again at a later epoch end. When the member ends, the leader alone records it; the helpers
go back to the master, which may send them to help another member.

Messages (over the job's communicator, rank 0 the master):

- master -> helper, ``TAG_HELP``: ``{"spec": spec, "leader": rank}``: help that member;
- master -> leader, ``TAG_HELP``: ``{"id": spec id, "helper": rank}``: a helper is waiting;
- leader -> helper, ``TAG_JOIN``: ``{"ranks": [leader, helpers...]}``: join the group of
  these ranks now (``Create_group``, collective over them only), or ``None``: the member
  ended first, go back (a leader that gets a help message for a member it no longer trains
  answers ``None`` too). Every helper gets exactly one answer, so none waits forever.

What this does to a member: its remaining epochs see the same global batches split over
more ranks (the same mean gradient, summed in another order; batch normalisation then
takes its statistics per shard), and its data order restarts at the join. A helped member
is a valid member of the same spec, not the bit-for-bit twin of the unhelped one, and its
record says how many ranks ended it (``helpers``). The choice of which members get help
depends on timing, so ``"auto"`` turns helpers on only at the scale where the tail costs
most (``AUTO_WORKERS`` workers or more); small runs stay reproducible unless asked.

``TailPlan`` is the master's bookkeeping (pure, O(log workers) per operation, also used
by the simulators); ``WorkerTail`` is a worker's side of the messages.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

#: a Keras member turns helpers away when its training steps take less than this many seconds:
#: the group's allreduce per step would then cost about what the helpers save
MIN_STEP_SECONDS = 0.02
#: a crew parts (the leader trains on alone) unless its steps run at least this many times
#: faster than the leader's alone, measured over two epochs after each growth
PAYS = 1.1
#: ``tail_helpers = "auto"``: helpers on from this many worker groups (below: off, reproducible)
AUTO_WORKERS = 32
#: ``tail_helpers = "auto"``: at most this many helpers join one member (a group of 8 ranks)
AUTO_HELPERS = 7
#: the parallel efficiency per doubling of a helped member's crew that rehearsals and the
#: simulators assume (``speedup``); real members are as fast as their allreduce lets them be
EFFICIENCY = 0.9


def helpers_per_member(setting: int | str, workers: int, group_size: int = 1) -> int:
    """How many helpers may join one member: the setting, or for ``"auto"`` ``AUTO_HELPERS``
    from ``AUTO_WORKERS`` workers on; 0 with member groups (``group_size > 1``: their
    communicators are fixed)."""
    if group_size > 1:
        return 0
    if setting == "auto":
        return AUTO_HELPERS if workers >= AUTO_WORKERS else 0
    return int(setting)


#: a member takes helpers only once it has trained this many times the members' mean
#: duration so far: a straggler, whose remaining time is likely long beside a join's cost
STRAGGLER = 0.5


@dataclass
class TailPlan:
    """Which idle worker helps which member: the master's side, pure bookkeeping.

    ``started(worker, spec_id, t)`` when a worker starts a member; ``ended(worker)`` when
    its result is in (returns the helpers it had, now free); ``assign(worker, now,
    mean_seconds)`` gives an idle worker the longest-running member with room that has
    trained ``STRAGGLER`` x ``mean_seconds`` (the members' mean so far; None: any), as
    ``(leader, spec_id)``, or None (the worker stays ``idle`` and is tried again with
    ``assign_idle``); ``decline(leader)``: that member's worker turned its helpers away
    (its steps are too short to share): they are free, and it takes no more.
    """

    max_helpers: int
    _heap: list[tuple[float, int, str]] = field(default_factory=list)    # (start, leader, spec id)
    training: dict[int, str] = field(default_factory=dict)               # leader -> the spec it trains now
    helpers: dict[int, list[int]] = field(default_factory=dict)          # leader -> its helpers
    helping: dict[int, int] = field(default_factory=dict)                # helper -> its leader
    idle: set[int] = field(default_factory=set)                          # idle workers no member could take yet
    closed: set[tuple[int, str]] = field(default_factory=set)            # (leader, spec id) that declined
    joined: int = 0                                                      # helpers sent in all
    declined: int = 0                                                    # helpers turned away

    def started(self, worker: int, spec_id: str, t: float) -> None:
        self.training[worker] = spec_id
        self.idle.discard(worker)
        if self.max_helpers > 0:
            heapq.heappush(self._heap, (t, worker, spec_id))

    def ended(self, worker: int) -> list[int]:
        spec_id = self.training.pop(worker, None)
        self.closed.discard((worker, spec_id))
        return self._free(worker)

    def decline(self, worker: int, spec_id: str) -> list[int]:
        if self.training.get(worker) != spec_id:
            return []
        self.closed.add((worker, spec_id))
        freed = self._free(worker)
        self.declined += len(freed)
        return freed

    def _free(self, worker: int) -> list[int]:
        """``worker``'s helpers, no longer helping it."""
        freed = self.helpers.pop(worker, [])
        for h in freed:
            self.helping.pop(h, None)
        return freed

    def busy(self, worker: int) -> bool:
        """Whether ``worker`` trains or helps a member."""
        return worker in self.training or worker in self.helping

    def assign(self, worker: int, now: float, mean_seconds: float | None = None) -> tuple[int, str] | None:
        heap = self._heap
        while heap:
            start, leader, spec_id = heap[0]
            if (self.training.get(leader) != spec_id or leader == worker or (leader, spec_id) in self.closed
                    or len(self.helpers.get(leader, ())) >= self.max_helpers):
                heapq.heappop(heap)                    # ended, full or declined: it never takes one again
                continue
            if mean_seconds is not None and now - start < STRAGGLER * mean_seconds:
                break                                  # the longest-running is no straggler (yet)
            self.helpers.setdefault(leader, []).append(worker)
            self.helping[worker] = leader
            self.idle.discard(worker)
            self.joined += 1
            return leader, spec_id
        self.idle.add(worker)
        return None

    def assign_idle(self, now: float, mean_seconds: float | None = None) -> list[tuple[int, int, str]]:
        """Idle workers that a member can take now: ``(worker, leader, spec_id)`` each."""
        out = []
        for w in sorted(self.idle):
            if self.busy(w):
                self.idle.discard(w)
                continue
            got = self.assign(w, now, mean_seconds)
            if got is None:
                break
            out.append((w, *got))
        return out


class WorkerTail:
    """A worker's side of the tail's messages over ``comm`` (the job's, master rank 0)."""

    def __init__(self, comm, max_sleep: float = 0.05):
        from ensemble.runtime import mpi
        self.mpi, self.comm, self.max_sleep = mpi, comm, max_sleep
        self.rank = comm.Get_rank()

    def arrived(self, spec_id: str) -> list[int]:
        """Leader, between epochs: helpers the master sent for ``spec_id`` since the last call
        (help for another member is answered: go back)."""
        out = []
        while (got := self.mpi.try_recv(self.comm, 0, self.mpi.TAG_HELP)) is not None:
            message = got[0]
            if message.get("id") == spec_id:
                out.append(int(message["helper"]))
            else:
                self.release([int(message["helper"])])
        return out

    def release(self, helpers: list[int]) -> None:
        """Leader: these helpers will not be joined (the member ended): send them back."""
        for h in helpers:
            self.comm.send(None, dest=h, tag=self.mpi.TAG_JOIN)

    def decline(self, spec_id: str, helpers: list[int]) -> None:
        """Leader: turn these helpers away and take no more for ``spec_id`` (the master hears)."""
        self.release(helpers)
        self.comm.send({"declined": spec_id}, dest=0, tag=self.mpi.TAG_HELP)

    def invite(self, ranks: list[int], new: list[int]) -> None:
        """Leader: tell the ``new`` helpers to form the group of ``ranks`` now."""
        for h in new:
            self.comm.send({"ranks": ranks}, dest=h, tag=self.mpi.TAG_JOIN)

    def answer(self, leader: int) -> list[int] | None:
        """Helper: wait (sleeping) for the leader: the group's ranks, or None (go back)."""
        message, _, _ = self.mpi.poll_recv(self.comm, leader, self.mpi.TAG_JOIN, self.max_sleep)
        return None if message is None else [int(r) for r in message["ranks"]]

    def form(self, ranks: list[int]):
        """Every rank of ``ranks`` (the leader first): the group's communicator."""
        group = self.comm.Get_group().Incl(ranks)
        try:
            return self.comm.Create_group(group, tag=self.mpi.TAG_JOIN + 1000 + ranks[0])
        finally:
            group.Free()


def speedup(ranks: int, efficiency: float) -> float:
    """Members a group of ``ranks`` trains per rank-second of one: ``ranks x efficiency **
    log2(ranks)`` (the simulators' model of a data-parallel group)."""
    import math
    return ranks * efficiency ** math.log2(ranks) if ranks > 1 else 1.0
