"""A master hierarchy (``runtime.sub_masters``): the top master, sub-masters, and who serves whom.

Rank 0 is the top master and runs the one master session with a ``HierarchyExecutor``
(the Executor seam: ``dispatch`` does not know it is there). Ranks 1..S are sub-masters;
the worker ranks after them are cut into member groups as usual and dealt to the
sub-masters in contiguous shares (a share is a run of ranks: a set of nodes). Each
sub-master runs ``serve_sub_master``: an ``MpiExecutor`` over its share (the same
executor, slots and specs in hand as a flat master) fed from the blocks of specs the top
master deals it, and every batch of results its workers send goes up as one message.

Messages: top -> sub-master, a list of specs (``TAG_SPEC``) or the stop (``TAG_STOP``);
sub-master -> top, ``{"results": [...], "room": n}`` (``TAG_RESULT``), where ``room`` is how
many specs the sub-master can hold now (its workers' slots plus one spec each in reserve,
so a result's round trip to the top never leaves a worker idle). The workers talk to their
sub-master over a communicator of the share, in which the sub-master is rank 0, so they run
the unchanged ``serve``. In-training reports are answered by the sub-master (continue): a
hierarchy is for runs whose decider changes nothing while members train.

Shares: where the mode allows it (``Mode.sub_master_books``: a fixed member list), the top
master deals no specs at all. Each sub-master runs its own share of the run
(``orchestrate.submasters.serve_share``: the members ``owner`` gives it, its own journal,
retention and budget, the same dispatch loop as a flat master) and sends the top only its
counts (``tally``) about once a second; the top (``ShareCoordinator``) keeps status.json and
the console, then absorbs the sub-masters' journals (``RunDirectory.absorb``) and selects.
Its cost no longer grows with the members per second.

Otherwise (a search breeds from every result) the top master deals every spec in blocks and
the results are forwarded to it, and it journals them as in a flat run.

Either way a result lost with a killed sub-master was never journalled, so ``--resume``
trains that member again, once, and a journalled member is never handed out again.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ensemble.runtime.executor import MAX_IN_HAND, Decide, MpiExecutor, gather, go_on, result_seconds, sleep_cap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """Who is what in a job of ``size`` ranks with ``sub_masters`` sub-masters and member
    groups of ``group_size`` ranks: rank 0 the top, ranks 1..S the sub-masters, then the
    groups, sub-master k serving groups ``shares[k]`` (contiguous)."""

    size: int
    sub_masters: int
    group_size: int

    @property
    def groups(self) -> int:
        return (self.size - 1 - self.sub_masters) // self.group_size

    @property
    def sub_ranks(self) -> list[int]:
        return list(range(1, 1 + self.sub_masters))

    def share(self, k: int) -> range:
        """The groups (0-based) sub-master ``k`` serves."""
        g, s = self.groups, self.sub_masters
        return range(k * g // s, (k + 1) * g // s)

    def shares(self) -> list[int]:
        """How many groups each sub-master serves."""
        return [len(self.share(k)) for k in range(self.sub_masters)]

    def first_rank(self, group: int) -> int:
        return 1 + self.sub_masters + group * self.group_size

    def role(self, rank: int) -> tuple[str, int]:
        """("top", 0), ("sub", k) or ("worker", k): the rank's role and its sub-master's index."""
        if rank == 0:
            return "top", 0
        if rank <= self.sub_masters:
            return "sub", rank - 1
        group = (rank - 1 - self.sub_masters) // self.group_size
        return "worker", next(k for k in range(self.sub_masters) if group in self.share(k))

    def problem(self) -> str | None:
        """Why the job cannot take this shape, or None."""
        workers = self.size - 1 - self.sub_masters
        if workers < 1 or workers % self.group_size:
            return (f"{self.sub_masters} sub-masters leave {max(workers, 0)} worker ranks of the {self.size - 1} "
                    f"besides the master, which `runtime.group_size` = {self.group_size} must divide")
        if self.groups < self.sub_masters:
            return (f"{self.sub_masters} sub-masters need a member group each, but the {workers} worker ranks "
                    f"make {self.groups}; start more ranks or set fewer `runtime.sub_masters`")
        return None


def owner(member_id: str, shares: list[int]) -> int:
    """Which sub-master's share a member belongs to: a hash of its id, weighted by the
    groups each serves, so shares stay in proportion to their workers, the same on every
    rank and in every job (a resume with another shape deals the members left anew)."""
    point = zlib.crc32(member_id.encode()) / 2**32 * sum(shares)
    edge = 0
    for k, n in enumerate(shares):
        edge += n
        if point < edge:
            return k
    return len(shares) - 1


def split(comm, layout: Layout):
    """Collective on ``comm``: (this rank's share communicator, its member group), each None
    where the rank has none. A share is sub-master k (its rank 0) and the ranks of its
    groups; the top master has neither."""
    rank = comm.Get_rank()
    role, k = layout.role(rank)
    singleton = layout.groups + rank                 # a colour of its own, freed at once
    group_colour = (rank - 1 - layout.sub_masters) // layout.group_size if role == "worker" else singleton
    group = comm.Split(group_colour, key=rank)
    share = comm.Split(layout.sub_masters if role == "top" else k, key=0 if role == "sub" else rank)
    if role != "worker":
        group.Free()
        group = None
    if role == "top":
        share.Free()
        share = None
    return share, group


def share_leaders(layout: Layout, k: int) -> list[int]:
    """The group leaders of sub-master ``k``'s share, as ranks of the share communicator."""
    return [1 + j * layout.group_size for j in range(len(layout.share(k)))]


def room_of(executor: MpiExecutor) -> int:
    """How many specs a sub-master holds: every worker's slots (specs in hand) plus one each."""
    return len(executor.leaders) * ((executor.slots.target or 1) + 1)


def serve_sub_master(comm, share, leaders: list[int], in_hand: int | None, max_sleep: float = 0.05,
                     helpers: int = 0) -> int:
    """A sub-master: train the blocks of specs the top master (rank 0 of ``comm``) deals on
    the share's workers (``leaders``, ranks of ``share``), forward every batch of results,
    until the top says stop; returns how many results went up. Once the top says no more
    specs come (``{"dry": True}``) and its queue is empty, idle workers of the share help its
    members still training (up to ``helpers`` each, ``runtime.tail``)."""
    from ensemble.runtime.mpi import ANY_TAG, TAG_RESULT, TAG_STOP, poll_recv, try_recv
    executor = MpiExecutor(share, leaders, max_sleep, in_hand, helpers=helpers)
    queue: deque[dict] = deque()
    sends: deque = deque()
    stopped = dry = False

    def take(got) -> None:
        nonlocal stopped, dry
        message, _, tag = got
        if tag == TAG_STOP:
            stopped = True
        elif isinstance(message, dict):             # {"dry": True}: the top has nothing more
            dry = True
        else:
            queue.extend(message)

    def drain() -> None:
        while (got := try_recv(comm, 0, ANY_TAG)) is not None:
            take(got)

    count = 0
    while True:
        drain()
        while queue and executor.free():
            executor.submit(queue.popleft())
        executor.tail(dry and not queue)
        if executor.busy():
            results = executor.wait(go_on, drain)
            sends.append(comm.isend({"results": results, "room": room_of(executor)}, dest=0, tag=TAG_RESULT))
            count += len(results)
            while sends and sends[0].Test():
                sends.popleft()
        elif stopped and not queue:
            break
        else:
            take(poll_recv(comm, 0, ANY_TAG, max_sleep))        # nothing to train: wait for the top
    while sends:
        sends.popleft().wait()
    executor.shutdown()
    log.debug("sub-master: %d results forwarded", count)
    return count


class HierarchyExecutor:
    """The top master's executor over sub-masters: deals specs in blocks to the sub-master
    with the most room, and returns the results of every batch that came up. ``shares``:
    the member groups each sub-master serves (their sum is ``workers``); ``in_hand``: the
    run's specs in hand (None: auto), which sizes each sub-master's first room."""

    def __init__(self, comm, sub_masters: list[int], shares: list[int], in_hand: int | None = None,
                 max_sleep: float = 0.05, batch: int = 256):
        from ensemble.runtime import mpi
        self.mpi = mpi
        self.comm, self.max_sleep, self.batch = comm, max_sleep, batch
        self.subs = list(sub_masters)
        self.index = {rank: k for k, rank in enumerate(self.subs)}
        self.offset = [sum(shares[:k]) for k in range(len(shares))]
        self.workers = sum(shares)
        self.room = [n * ((in_hand or MAX_IN_HAND) + 1) for n in shares]
        self.out = [0] * len(self.subs)
        self.pending: list[list[dict]] = [[] for _ in self.subs]
        self._sends: deque = deque()
        self.idle_seconds = 0.0                     # time spent waiting with nothing to do
        self.report_bytes = 0                        # reports are answered by the sub-masters
        self.mean_seconds: float | None = None
        self.blocks = 0                              # spec messages sent (for the benchmark)
        self._dry = False                            # the sub-masters were told that no more specs come

    def free(self) -> int:
        return sum(max(0, r - o) for r, o in zip(self.room, self.out))

    def submit(self, spec: dict) -> None:
        k = max(range(len(self.subs)), key=lambda i: self.room[i] - self.out[i])
        self.out[k] += 1
        self.pending[k].append(spec)

    def busy(self) -> int:
        return sum(self.out)

    def _flush(self) -> None:
        """Send every sub-master its block of the specs submitted since the last flush."""
        for k, block in enumerate(self.pending):
            if block:
                self._sends.append(self.comm.isend(block, dest=self.subs[k], tag=self.mpi.TAG_SPEC))
                self.pending[k] = []
                self.blocks += 1
        while self._sends and self._sends[0].Test():
            self._sends.popleft()

    def _take(self, message: dict, source: int) -> list[dict]:
        k = self.index[source]
        results = message["results"]
        for result in results:
            result["worker"] += self.offset[k]
            seconds = result_seconds(result)
            if seconds is not None:
                mean = self.mean_seconds
                self.mean_seconds = seconds if mean is None else mean + 0.1 * (seconds - mean)
        self.out[k] -= len(results)
        self.room[k] = message["room"]
        return results

    def wait(self, decide: Decide, idle: Callable[[], None] | None = None) -> list[dict]:
        """Flush the blocks, then wait for batches of results (the sub-masters answer the
        reports; ``decide`` is not asked)."""
        mpi = self.mpi
        self._flush()
        def poll() -> list[dict] | None:
            got = mpi.try_recv(self.comm, mpi.ANY_SOURCE, mpi.TAG_RESULT)
            return None if got is None else self._take(got[0], got[1])
        results, waited = gather(poll, self.batch, sleep_cap(self.max_sleep, self.mean_seconds), idle)
        self.idle_seconds += waited
        return results

    def shutdown(self) -> None:
        self._flush()
        self.mpi.polite_wait(self._sends, self.max_sleep)      # every block delivered before the stops
        self._sends.clear()
        for rank in self.subs:
            self.comm.send(None, dest=rank, tag=self.mpi.TAG_STOP)

    def answer(self, spec_id: str, decision: dict) -> None:
        raise RuntimeError("a master hierarchy holds no reports (its sub-masters answer them); "
                           "set `runtime.sub_masters = 0` for a run whose decider holds members")

    def tail(self, dry: bool) -> None:
        """From the first ``dry``: tell every sub-master (after its last block) that no more
        specs come; each lets its idle workers help its own members once its queue is empty
        (``runtime.tail``; a share's workers help only members of their share)."""
        if not dry or self._dry:
            return
        self._dry = True
        self._flush()
        for rank in self.subs:
            self._sends.append(self.comm.isend({"dry": True}, dest=rank, tag=self.mpi.TAG_SPEC))


#: how often (seconds) a sub-master that runs its own share sends the top master its tally
TALLY_SECONDS = 1.0


class ShareCoordinator:
    """The top master of a hierarchy whose sub-masters each run their own share
    (``orchestrate.submasters.serve_share``). It deals no specs and takes no results: ``run``
    tells every sub-master to start (``go``: what the top read on resume), then takes their
    tallies until each has closed its books. It stands where the master session's executor
    stands for what the session asks of one (``workers``, ``report_bytes``, ``answer``)."""

    def __init__(self, comm, sub_masters: list[int], shares: list[int], max_sleep: float = 0.05):
        from ensemble.runtime import mpi
        self.mpi, self.comm, self.max_sleep = mpi, comm, max_sleep
        self.subs = list(sub_masters)
        self.workers = sum(shares)
        self.report_bytes = 0
        self.tallies: dict[int, dict] = {}
        self.closed: dict[int, dict] = {}

    def answer(self, spec_id: str, decision: dict) -> None:
        raise RuntimeError("sub-masters that run their own shares hold no reports")

    def run(self, go: dict, on_tallies: Callable[[list[dict]], None], idle: Callable[[], None],
            clock: Callable[[], float] = time.time) -> dict:
        """Start every share, take tallies until all are closed; returns the top's account
        (as ``dispatch``'s, with each sub-master's own under ``shares``)."""
        mpi = self.mpi
        for rank in self.subs:
            self.comm.send(go, dest=rank, tag=mpi.TAG_SPEC)
        wall0, cpu0 = clock(), time.thread_time()
        sleep = 1e-3
        while len(self.closed) < len(self.subs):
            got = mpi.try_recv(self.comm, mpi.ANY_SOURCE, mpi.TAG_RESULT)
            if got is None:
                idle()
                time.sleep(sleep)
                sleep = min(2 * sleep, self.max_sleep)
                continue
            sleep = 1e-3
            message, source, _ = got
            self.tallies[source] = message["tally"]
            if "closed" in message:
                self.closed[source] = message["closed"]
            on_tallies(list(self.tallies.values()))
        cpu = time.thread_time() - cpu0
        shares = [self.closed[rank] for rank in self.subs]
        return {"results": sum(s["results"] for s in shares), "master_wall_seconds": round(clock() - wall0, 4),
                "master_cpu_seconds": round(cpu, 4), "master_busy_seconds": round(cpu, 4), "shares": shares}


def node_groups(nodes: list[int], group_size: int) -> list[list[int]]:
    """The worker ranks (1..P-1) cut into member groups of ``group_size``, each inside one node
    where it can be (``nodes[r]``: rank r's node): every node's workers make whole groups first,
    in rank order; the rest (the master's node is one worker short of a whole node, and a job
    may leave slots empty) are grouped across nodes, node by node. Contiguous ranks otherwise:
    with every rank on one node, groups are 1..g, g+1..2g, ... A gradient allreduce inside a
    node runs over its GPUs' links, across nodes over the network (a job of 3 nodes of 8 GPUs
    with groups of 8, block placement: both groups spanned two nodes; now one)."""
    workers = list(range(1, len(nodes)))
    if group_size < 1 or len(workers) % group_size:
        raise ValueError(f"`runtime.group_size` = {group_size} must divide the {len(workers)} worker ranks")
    on: dict[int, list[int]] = {}
    for r in workers:
        on.setdefault(nodes[r], []).append(r)
    whole, rest = [], []
    for ranks in on.values():
        cut = len(ranks) - len(ranks) % group_size
        whole += [ranks[a:a + group_size] for a in range(0, cut, group_size)]
        rest += ranks[cut:]
    groups = whole + [rest[a:a + group_size] for a in range(0, len(rest), group_size)]
    return sorted(groups, key=lambda g: g[0])
