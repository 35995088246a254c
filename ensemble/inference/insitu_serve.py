"""The MPI side of in-situ inference (``ensemble.inference.insitu``): one read of the run
for every rank, errors raised on every rank together, and the "node" placement's
server loop and client calls.

Placement "node": each node's ranks (a shared-memory split of ``comm``) are cut into
``servers_per_node`` servers (the node's first ranks) and clients (the rest, dealt round
robin to the servers). A client sends its normalised rows to its server and waits
(sleeping, not spinning) for its rows of the answer. A server gathers requests until
every client it still serves has one pending or ``batch_wait`` seconds passed since the
first, runs them as one batch through the combined graph and sends each client its rows;
it loops until all its clients have said done. An error in a batch goes back to the
clients that asked, as a ``PredictError`` raised there; the server keeps serving.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from ensemble.inference.load import EnsembleRun, PredictError, load_run
from ensemble.runtime import mpi

T = TypeVar("T")
#: the longest a waiting client or an idle server sleeps between two looks (seconds)
MAX_SLEEP = 0.001


def shared_run(comm, run_dir: str | Path) -> EnsembleRun:
    """The run as rank 0 of ``comm`` read it (one read of the directory and its member hashes
    for the whole job); a bad directory raises rank 0's ``PredictError`` on every rank."""
    got: tuple[EnsembleRun | None, str | None] = (None, None)
    if comm.Get_rank() == 0:
        try:
            got = (load_run(run_dir), None)
        except PredictError as exc:
            got = (None, str(exc))
    run, error = mpi.polite_bcast(comm, got)
    if error:
        raise PredictError(error)
    return run


def collective(comm, make: Callable[[], T]) -> T:
    """``make()`` on every rank; if it fails anywhere, every rank raises one ``PredictError``
    naming each failed rank (so no rank waits for one that died)."""
    value, error = None, None
    try:
        value = make()
    except Exception as exc:                 # noqa: BLE001 - reported on every rank just below
        error = str(exc) if isinstance(exc, PredictError) else repr(exc)
    by_error: dict[str, list[int]] = {}
    for rank, e in enumerate(comm.allgather(error)):
        if e:
            by_error.setdefault(e, []).append(rank)
    if by_error:                             # the same error on many ranks is said once, with its ranks
        raise PredictError("; ".join(f"rank{'s' * (len(r) > 1)} {', '.join(map(str, r))}: {e}"
                                     for e, r in by_error.items()))
    return value


@dataclass
class ServeStats:
    """What one server did: batches run, requests and rows answered, seconds in the graph."""
    batches: int = 0
    requests: int = 0
    rows: int = 0
    largest_batch: int = 0
    seconds: float = 0.0


class NodeLink:
    """This rank's place in the "node" placement: server or client, on the node communicator."""

    def __init__(self, node, is_server: bool, server: int | None, clients: list[int], sim_comm,
                 batch_wait: float):
        self.node, self.is_server, self.server, self.clients = node, is_server, server, clients
        self.sim_comm, self.batch_wait = sim_comm, batch_wait

    @classmethod
    def make(cls, comm, servers_per_node: int, batch_wait: float = 0.002) -> NodeLink:
        """Split ``comm`` by node and into servers and clients; collective. Every rank raises the
        same error when some node has too few ranks to keep a client."""
        if int(servers_per_node) < 1:
            raise PredictError(f"servers_per_node must be at least 1, but got {servers_per_node}")
        node = mpi.split_node(comm)
        sizes = comm.allgather(node.Get_size())
        if min(sizes) < 2:
            node.Free()
            raise PredictError(f"placement 'node' needs at least 2 ranks on every node (a server and a client), "
                               f"but a node has {min(sizes)}; use placement 'local', or start more ranks per node")
        if int(servers_per_node) > min(sizes) - 1 and comm.Get_rank() == 0:
            warnings.warn(f"servers_per_node = {servers_per_node} leaves no client on a node of {min(sizes)} ranks: "
                          f"that node runs {min(sizes) - 1} server(s) and 1 client; start more ranks per node or "
                          "ask for fewer servers", stacklevel=3)
        size, rank = node.Get_size(), node.Get_rank()
        servers = min(int(servers_per_node), size - 1)
        is_server = rank < servers
        clients = [c for c in range(servers, size) if (c - servers) % servers == rank] if is_server else []
        server = None if is_server else (rank - servers) % servers
        sim = comm.Split(1 if is_server else 0, comm.Get_rank())
        return cls(node, is_server, server, clients, None if is_server else sim, batch_wait)

    # -- a client ------------------------------------------------------------------------
    def ask(self, x: np.ndarray) -> dict:
        """Send normalised rows to this client's server; its answer for them (or its error, raised)."""
        self.node.send(x, dest=self.server, tag=mpi.TAG_INSITU_REQUEST)
        reply = mpi.poll_recv(self.node, self.server, mpi.TAG_INSITU_REPLY, max_sleep=MAX_SLEEP)[0]
        if isinstance(reply, str):
            raise PredictError(f"the in-situ server (node rank {self.server}): {reply}")
        return reply

    def done(self) -> None:
        self.node.send(None, dest=self.server, tag=mpi.TAG_INSITU_DONE)

    # -- a server ------------------------------------------------------------------------
    def serve(self, graph) -> ServeStats:
        """Answer this server's clients, in batches, until every one of them has said done."""
        stats, active, pending = ServeStats(), set(self.clients), {}
        first, sleep = 0.0, 1e-5
        while active:
            got = mpi.try_recv(self.node)
            if got is not None:
                msg, source, tag = got
                if tag == mpi.TAG_INSITU_DONE:
                    active.discard(source)
                elif tag == mpi.TAG_INSITU_REQUEST:
                    first = first if pending else time.perf_counter()
                    pending[source] = msg
                sleep = 1e-5
            if pending and (set(pending) >= active or time.perf_counter() - first >= self.batch_wait):
                self._answer(graph, pending, stats)
                pending = {}
            elif got is None:
                time.sleep(sleep)
                sleep = min(sleep * 2, MAX_SLEEP)
        return stats

    def _answer(self, graph, pending: dict[int, np.ndarray], stats: ServeStats) -> None:
        order = sorted(pending)
        counts = [len(pending[c]) for c in order]
        t0 = time.perf_counter()
        try:
            result = graph.predict(np.concatenate([pending[c] for c in order]))
        except Exception as exc:                 # noqa: BLE001 - the clients raise it; serving goes on
            for c in order:
                self.node.send(f"{type(exc).__name__}: {exc}", dest=c, tag=mpi.TAG_INSITU_REPLY)
            return
        from ensemble.inference.insitu import rows
        start = 0
        for c, n in zip(order, counts):
            self.node.send(rows(result, start, start + n), dest=c, tag=mpi.TAG_INSITU_REPLY)
            start += n
        stats.batches, stats.requests = stats.batches + 1, stats.requests + len(order)
        stats.rows, stats.largest_batch = stats.rows + sum(counts), max(stats.largest_batch, sum(counts))
        stats.seconds += time.perf_counter() - t0
