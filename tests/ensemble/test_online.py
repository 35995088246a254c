"""Online training's pure logic: the replay buffer's policies and what it drops when
training is behind, the simulation side's window (drops counted, never a wait), the
stream over a link that never answers, and the mode's checks."""

from __future__ import annotations

import numpy as np
import pytest

from ensemble.config import Problems, resolve_config
from ensemble.runtime import coupling, mpi
from ensemble.sources.replay import ReplayBuffer, newest


def batch(start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples whose x and y are their own numbers start..start+n-1."""
    v = np.arange(start, start + n, dtype=np.float32)
    return v[:, None].repeat(2, axis=1), v


def test_fifo_keeps_the_newest():
    buf = ReplayBuffer(10, "fifo")
    for k in range(7):
        buf.offer(*batch(3 * k, 3), rank=0, seq=k)
    snap = buf.snapshot()
    assert buf.size == 10 and sorted(snap["y"].tolist()) == list(range(11, 21))
    assert newest(snap) == {0: 6}


def test_reservoir_keeps_a_uniform_sample_of_everything():
    kept = []
    for seed in range(40):
        buf = ReplayBuffer(100, "reservoir", seed=seed)
        for k in range(100):
            buf.offer(*batch(10 * k, 10), rank=k % 2, seq=k)
        snap = buf.snapshot()
        assert buf.size == 100 and len(set(snap["y"].tolist())) == 100
        kept.append(snap["y"])
    y = np.concatenate(kept)
    # uniform over 0..999: the mean near 499.5 and every tenth of the stream about as often
    assert abs(y.mean() - 499.5) < 25
    share = np.bincount((y // 100).astype(int), minlength=10) / len(y)
    assert share.min() > 0.07 and share.max() < 0.13
    assert buf.counts.taken == 1000 and buf.counts.dropped == 0


def test_reservoir_fills_first_then_replaces_in_place():
    buf = ReplayBuffer(5, "reservoir", seed=1)
    buf.offer(*batch(0, 3))
    assert buf.size == 3 and sorted(buf.snapshot()["y"].tolist()) == [0, 1, 2]
    buf.offer(*batch(3, 4))
    assert buf.size == 5 and {0, 1, 2, 3, 4} <= set(range(7))


def test_when_behind_drop_counts_until_the_next_snapshot():
    buf = ReplayBuffer(100, "fifo", when_behind="drop", max_unseen=8)
    assert buf.offer(*batch(0, 5)) == 5
    assert buf.offer(*batch(5, 5)) == 3                  # 8 unseen: the rest is dropped
    assert buf.offer(*batch(10, 5)) == 0
    assert buf.counts.dropped == 7 and buf.counts.offered == 15 and buf.size == 8
    buf.snapshot()                                       # a member started: room again
    assert buf.offer(*batch(15, 5)) == 5


def test_when_behind_replace_takes_everything():
    buf = ReplayBuffer(4, "fifo", when_behind="replace", max_unseen=2)
    assert buf.offer(*batch(0, 10)) == 10
    assert buf.counts.dropped == 0 and sorted(buf.snapshot()["y"].tolist()) == [6, 7, 8, 9]


def test_restore_and_bad_settings():
    buf = ReplayBuffer(6, "fifo")
    buf.offer(*batch(0, 6), rank=1, seq=4)
    other = ReplayBuffer(4, "reservoir")
    other.restore(buf.snapshot())
    assert other.size == 4 and sorted(other.snapshot()["y"].tolist()) == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="online.policy"):
        ReplayBuffer(4, "lifo")
    with pytest.raises(ValueError, match="online.buffer"):
        ReplayBuffer(0)
    with pytest.raises(ValueError, match="shape"):
        buf.offer(np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(3).snapshot()


def test_window_drops_and_counts_when_full():
    w = coupling.Window(2)
    assert w.take(10, 0.0) == 0 and w.take(10, 0.1) == 1
    assert w.take(10, 0.2) is None and w.dropped == 10   # full: dropped, never waited for
    w.acked(0, taken=4)                                  # the ensemble side took 4 of 10
    assert w.dropped_remote == 6 and w.open()
    assert w.take(5, 0.3) == 2 and w.sent == 25 and w.sent_at[2] == 0.3
    with pytest.raises(ValueError):
        coupling.Window(0)


class Silent:
    """An intercommunicator whose other side never answers: sends stay in flight."""

    def __init__(self):
        self.sent = []

    def isend(self, msg, dest, tag):
        self.sent.append((msg, dest, tag))
        return type("Pending", (), {"Test": lambda self: False})()

    def improbe(self, source, tag, status=None):
        return None


def test_stream_never_waits_and_counts_drops():
    from ensemble.inference.online import Stream
    inter = Silent()
    stream = Stream(comm=None, inter=inter, in_flight=3)
    results = [stream.send(*batch(4 * k, 4)) for k in range(5)]
    assert results == [True, True, True, False, False]
    assert stream.stats.sent == 12 and stream.window.dropped == 8
    assert [m["seq"] for m, _, tag in inter.sent] == [0, 1, 2] and inter.sent[0][2] == mpi.TAG_ONLINE_UP
    assert stream.ensemble() is None and stream.generation == 0   # nothing published: no wait either


def test_online_config_and_preflight():
    from ensemble.modes import mode_of
    cfg = resolve_config({"mode": "online", "data": {"source": "digits"},
                          "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    found = Problems()
    mode_of(cfg).preflight(cfg, {"task": "classification"}, None, found)
    text = str(found.messages if hasattr(found, "messages") else found)
    assert "data.source" in text and "regression" in text
    assert cfg.online.buffer > 0 and cfg.online.policy in ("reservoir", "fifo")
    with pytest.raises(Exception, match="architectures"):
        resolve_config({"mode": "online", "data": {"source": "seed.npz"}})


def test_a_classification_task_in_the_config_is_refused_before_the_warm_up():
    """It was refused only once 512 warm-up samples had come, with the simulation never told."""
    from ensemble.modes import mode_of
    cfg = resolve_config({"mode": "online", "data": {"source": "seed.npz", "task": "classification"},
                          "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    found = Problems()
    mode_of(cfg).preflight(cfg, None, 1, found)            # check_world's call, before any sample
    with pytest.raises(Exception, match="`data.task` is 'classification'"):
        found.raise_any()


def test_an_abandoned_run_tells_the_simulation(monkeypatch):
    """A run that ended before training (a data or config error after the warm-up) left the
    simulation streaming into nothing, and its close() waited 60 s."""
    from ensemble.modes import mode_of
    from ensemble.modes import online as online_mode
    said = []

    class Inlet:
        def stop(self, reason: str = "") -> None:
            said.append(reason)
    monkeypatch.setitem(online_mode._LINK, "inlet", Inlet())
    cfg = resolve_config({"mode": "online", "data": {"source": "seed.npz"},
                          "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    mode_of(cfg).abandon("data error: the labels are fractional")
    assert said == ["before training: data error: the labels are fractional"]


def test_reselect_chooses_among_the_online_window_as_the_run_did():
    """`ensemble reselect` on an online run chose among all 28 members, an old one included,
    which the window exists to keep out."""
    from ensemble.modes import mode_of
    from ensemble.results.records import MemberRecord
    cfg = resolve_config({"mode": "online", "data": {"source": "seed.npz"}, "online": {"window": 3},
                          "architectures": [{"layers": [{"type": "Dense", "units": 4}]}]})
    records = [MemberRecord.from_json({"id": f"o-{i:05d}", "status": "failed" if i == 9 else "ok"})
               for i in (10, 2, 9, 7, 8, 1)]
    assert mode_of(cfg).selection_pool(cfg, records) == {"o-00007", "o-00008", "o-00010"}
    every = cfg.replace(online=cfg.online.replace(window=0))
    assert mode_of(every).selection_pool(every, records) is None


def test_a_publication_selects_among_the_newest_members_and_says_its_generation(tmp_path):
    import threading

    from ensemble.results.records import MemberRecord, Status
    from ensemble.results.rundir import RunDirectory
    from ensemble.sources.base import Hooks
    from ensemble.sources.online import OnlineSource

    class Link:
        lock, closed, sim_counts = threading.RLock(), threading.Event(), {}
        refused, refused_error, error = 0, None, None             # what the section reads of an Inlet

        def __init__(self):
            self.told = []

        def announce(self, generation, run_dir, seqs=None):
            self.told.append((generation, seqs))

        def failed(self, generation, error):
            self.told.append((generation, error))

    cfg = resolve_config({"mode": "online", "data": {"source": "seed.npz"},
                          "architectures": [{"layers": [{"type": "Dense", "units": 4}]}],
                          "online": {"warmup": 4, "publish_every": 2, "window": 3}})
    buffer = ReplayBuffer(16, "fifo")
    buffer.offer(*batch(0, 8), rank=1, seq=7)
    link = Link()
    source = OnlineSource(cfg, RunDirectory(tmp_path), link, buffer, [], 0, 2)
    asked = []

    def publish(extra, among=None):
        asked.append(among)
        if len(asked) == 2:
            raise OSError("disk full")                       # a publish that fails: said, not raised
        return {"members": [{"id": i} for i in sorted(among)]}
    source.bind(Hooks(event=lambda e: None, answer=lambda i, d: None, deadline=lambda: None, clock=lambda: 0.0,
                      publish=publish))
    for _ in range(6):
        spec = source.next_spec()
        assert spec["online"]["buffer"].startswith("online/buffer-")
        source.tell(MemberRecord(id=spec["id"], status=Status.OK))
    source.tell(MemberRecord(id="o-99999", status=Status.FAILED))
    source.next_spec()
    assert asked == [frozenset({"o-00000", "o-00001"}), frozenset({"o-00001", "o-00002", "o-00003"}),
                     frozenset({"o-00003", "o-00004", "o-00005"})]
    assert link.told[0] == (1, {1: 7}) and link.told[1] == (2, "OSError: disk full") and link.told[2][0] == 2
    assert source.generation == 2 and source.failed_publishes == 1 and source.failed_members == 1


class OneRank(Silent):
    """The ensemble master's side of a link to one simulation rank that says nothing unasked."""

    def Get_remote_size(self):
        return 1

    def send(self, msg, dest, tag):
        self.sent.append((msg, dest, tag))


def test_a_batch_of_another_shape_is_refused_and_said_and_the_link_goes_on(caplog):
    """The buffer refuses a batch of 7 features after batches of 2: the simulation is told why
    in its ack, the samples are counted, and later good batches are taken as before."""
    buffer = ReplayBuffer(100, policy="fifo")
    inter = OneRank()
    inlet = coupling.Inlet(inter, lambda rank, seq, x, y: buffer.offer(x, y, rank, seq))
    try:
        wide = (np.zeros((3, 7), np.float32), np.zeros(3, np.float32))
        nan = batch(8, 4)                 # NaN samples: taken, they made every later member fail (nan_loss)
        nan[0][1, 0] = np.nan
        with inlet.lock:
            for seq, (x, y) in enumerate((batch(0, 4), wide, nan, batch(4, 4))):
                inlet._handle({"kind": coupling.SAMPLES, "seq": seq, "sent": 0.0, "x": x, "y": y}, 0)
        acks = [m for m, _, _ in inter.sent if m["kind"] == coupling.ACK]
        assert [a["taken"] for a in acks] == [4, 0, 0, 4]
        assert "error" not in acks[0] and "shape" in acks[1]["error"]
        assert "samples with NaN/inf inputs: the batch is refused (1 of its 4, first rows [1])" in acks[2]["error"]
        assert np.isfinite(buffer.x[:8]).all()
        assert inlet.refused == 7 and inlet.error is None and not inlet.closed.is_set()
        assert "was refused" in caplog.text
    finally:
        inlet.stop()
    window = coupling.Window(4)                           # the simulation's side counts them as refused
    for n in (4, 3):
        window.take(n, 0.0)
    window.acked(1, 0)
    assert window.dropped_remote == 3
