"""``[tracking]``: TensorBoard event files read back with TensorBoard's own reader, the
background queue's batching, retries and bounded give-up (on a sink that fails for real,
not a mock of MLflow), and the missing-extra error.

The MLflow server tests are in tests/mpi/test_tracking_mpi.py.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
import time

import pytest

from ensemble.config import ConfigError
from ensemble.config.schema import resolve_config
from ensemble.results.records import MemberRecord
from ensemble.results.rundir import RunDirectory
from ensemble.results.tracking import Background, Tracking, view_of

needs_tb = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                              reason='needs pip install "mpi-ensemble[tracking]"')

ARCH = [{"name": "mlp", "members": 3, "layers": [{"type": "Dense", "units": 4}]}]


def config(**tracking):
    return resolve_config({"architectures": ARCH, "tracking": tracking})


def record(i: int, status: str = "ok", epochs: int = 3) -> MemberRecord:
    history = {"loss": [1.0 / (e + 1 + i) for e in range(epochs)],
               "val_loss": [1.5 / (e + 1 + i) for e in range(epochs)],
               "accuracy": [0.5 + 0.1 * e for e in range(epochs)]}
    line = {"id": f"mlp-{i:03d}", "status": status, "arch": "mlp", "seed": 100 + i, "params": 50, "epochs": epochs,
            "train_seconds": 1.5, "ended": 1.7e9 + i, "genome": {"units": 8 * (i + 1), "act": "relu"},
            "val": {"accuracy": 0.8 + i / 100, "log_loss": 0.4}, "test": {"accuracy": 0.79 + i / 100},
            "payload": {"arrays": {}, "meta": {"history": history}}}
    if status == "failed":
        line = {k: line[k] for k in ("id", "status", "arch", "seed")} | {"error": {"kind": "nan", "message": "x"}}
    return MemberRecord.from_json(line)


def test_a_member_view_has_hyperparameters_history_and_final_metrics():
    view = view_of(record(1))
    assert view.hparams == {"arch": "mlp", "seed": 101, "params": 50, "epochs": 3, "genome.units": 16,
                            "genome.act": "relu"}
    assert view.final == {"val/accuracy": 0.81, "val/log_loss": 0.4, "test/accuracy": 0.8}
    assert view.history["loss"] == [0.5, 1 / 3, 0.25]


@needs_tb
@pytest.mark.slow             # TensorBoard's reader imports TensorFlow
def test_tensorboard_holds_every_members_scalars_and_hparams(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata
    tracking = Tracking(config(tensorboard=True, batch_seconds=0.05), tmp_path, {"task": "classification"})
    records = [record(i) for i in range(3)] + [record(3, "failed")]
    tracking.results(records[:2])
    tracking.results(records[2:])
    tracking.finish({"ensemble": {"val": {"accuracy": 0.9}, "test": {"accuracy": 0.88}},
                     "best_member": {"val": {"accuracy": 0.83}}})
    tracking.close()
    logdir = tmp_path / "tensorboard"
    for r in records:
        acc = EventAccumulator(str(logdir / "members" / r.id)).Reload()
        scalars = set(acc.Tags()["scalars"])
        content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
        start = metadata.parse_session_start_info_plugin_data(content)
        assert start.group_name == r.id and start.hparams["status"].string_value == r.status.value
        if r.status.value == "failed":
            assert scalars == set()
            continue
        assert scalars == {"epoch/loss", "epoch/val_loss", "epoch/accuracy", "val/accuracy", "val/log_loss",
                           "test/accuracy", "train_seconds"}
        losses = acc.Scalars("epoch/loss")
        assert [e.step for e in losses] == [1, 2, 3]
        assert [e.value for e in losses] == pytest.approx(r.extra["payload"]["meta"]["history"]["loss"])
        assert acc.Scalars("val/accuracy")[0].value == pytest.approx(r.val["accuracy"])
        assert start.hparams["genome.units"].number_value == r.genome["units"]
    experiment = EventAccumulator(str(logdir)).Reload()
    exp = metadata.parse_experiment_plugin_data(
        experiment.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG])
    assert {h.name for h in exp.hparam_infos} == {"arch", "seed", "params", "epochs", "genome.units", "genome.act",
                                                 "status"}
    assert {m.name.tag for m in exp.metric_infos} >= {"val/accuracy", "test/accuracy"}
    ens = EventAccumulator(str(logdir / "ensemble")).Reload()
    assert ens.Scalars("test/accuracy")[0].value == pytest.approx(0.88)
    assert ens.Scalars("best_member/val/accuracy")[0].value == pytest.approx(0.83)


@needs_tb
@pytest.mark.slow             # TensorBoard's reader imports TensorFlow
def test_a_resume_writes_the_members_an_earlier_job_left_out(tmp_path):
    """``--resume`` with TensorBoard on: members the journal held when the job began are
    written from it (their curves from the store, their HParams sessions), except those an
    earlier job wrote; a member this job ended is written once, as it ends."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    from ensemble.results.store import PackStore
    run = RunDirectory(tmp_path)
    old = [record(i) for i in range(3)]
    store = PackStore(run.path / run.STORE)
    for r in old:
        store.put(r.id, {}, r.extra["payload"]["meta"])
    store.close()
    lines = [{k: v for k, v in r.to_json().items() if k != "payload"} for r in old]
    (run.path / run.JOURNAL).write_text("".join(json.dumps(x) + "\n" for x in lines))
    upto = (run.path / run.JOURNAL).stat().st_size
    written = tmp_path / "tensorboard" / "members" / old[0].id    # an earlier job wrote this one
    written.mkdir(parents=True)
    (written / "events.out.tfevents.1.earlier").write_bytes(b"")
    with open(run.path / run.JOURNAL, "a") as fh:                # this job's first member, journaled
        fh.write(json.dumps({k: v for k, v in record(3).to_json().items() if k != "payload"}) + "\n")
    tracking = Tracking(config(tensorboard=True, batch_seconds=0.05), tmp_path, {"task": "classification"},
                        resume=True, known_upto=upto)
    tracking.results([record(3, epochs=2)])                       # and sent as it ends
    tracking.close()
    members = tmp_path / "tensorboard" / "members"
    assert sorted(p.name for p in written.iterdir()) == ["events.out.tfevents.1.earlier"]
    for r in old[1:]:
        acc = EventAccumulator(str(members / r.id)).Reload()
        losses = [e.value for e in acc.Scalars("epoch/loss")]
        assert losses == pytest.approx(r.extra["payload"]["meta"]["history"]["loss"])
        assert acc.Scalars("val/accuracy")[0].value == pytest.approx(r.val["accuracy"])
    assert len(list((members / record(3).id).glob("events.out.tfevents.*"))) == 1    # once, as it ended
    for r in old[1:]:                                               # in the HParams dashboard
        content = EventAccumulator(str(members / r.id)).Reload().PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        assert start.group_name == r.id and start.hparams["genome.units"].number_value == r.genome["units"]


class Flaky:
    """A sink that fails its first ``fails`` calls (as a server that refuses for a while)."""

    name, where = "flaky", "memory"

    def __init__(self, fails: int):
        self.fails, self.calls, self.members_seen, self.ensembles, self.closed = fails, 0, [], 0, None

    def members(self, views):
        self.calls += 1
        if self.calls <= self.fails:
            raise ConnectionError("refused")
        self.members_seen += [v.id for v in views]

    def ensemble(self, summary, files):
        self.ensembles += 1

    def close(self, ok):
        self.closed = ok


def test_the_queue_batches_and_retries_until_it_gets_through():
    sink = Flaky(fails=2)
    bg = Background(sink, queue_size=100, batch_seconds=0.2, give_up_seconds=30, cpu_share=1.0)
    for i in range(5):
        bg.put(("members", [view_of(record(i))]))
    bg.put(("ensemble", ({}, [])))
    bg.close(True, wait=20)
    assert sink.members_seen == [f"mlp-{i:03d}" for i in range(5)]       # in order, once each
    assert sink.calls == 3 and sink.ensembles == 1 and sink.closed is True and bg.dropped == 0


def test_a_sink_that_keeps_failing_is_given_up_once_and_drops_the_rest(caplog):
    sink = Flaky(fails=10**9)
    bg = Background(sink, queue_size=100, batch_seconds=0.01, give_up_seconds=0.3, cpu_share=1.0)
    with caplog.at_level(logging.WARNING, logger="ensemble.tracking"):
        bg.put(("members", [view_of(record(0))]))
        deadline = time.monotonic() + 10
        while bg.gave_up is None and time.monotonic() < deadline:
            time.sleep(0.02)
        for i in range(1, 4):
            bg.put(("members", [view_of(record(i))]))
        bg.put(("ensemble", ({}, [])))
        bg.close(True, wait=1)
    assert bg.gave_up == "ConnectionError: refused"
    assert bg.dropped == 5 and sink.members_seen == [] and sink.closed is None
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_sink_still_retrying_when_the_run_ends_says_its_last_error(caplog):
    """A sink that fails longer than the run's finish (give-up 60 s, finish 0.3 s): the one
    warning names the failure it was retrying, not just the writes dropped."""
    sink = Flaky(fails=10**9)
    bg = Background(sink, queue_size=100, batch_seconds=0.01, give_up_seconds=60, cpu_share=1.0)
    with caplog.at_level(logging.WARNING, logger="ensemble.tracking"):
        bg.put(("members", [view_of(record(0))]))
        deadline = time.monotonic() + 10
        while sink.calls < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        bg.close(True, wait=0.3)
    assert "did not finish within" in caplog.text and "retrying after: ConnectionError: refused" in caplog.text


class Burner(Flaky):
    """Each write costs 0.05 s of the thread's CPU."""
    def members(self, views):
        super().members(views)
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass


def two_writes(cpu_share: float) -> tuple[list[str], Background]:
    """What a sink has written 0.2 s after a second batch arrived behind a first that cost 0.05 s."""
    sink = Burner(0)
    bg = Background(sink, queue_size=100, batch_seconds=0.0, give_up_seconds=30, cpu_share=cpu_share)
    bg.put(("members", [view_of(record(0))]))
    deadline = time.monotonic() + 10
    while not sink.members_seen and time.monotonic() < deadline:
        time.sleep(0.01)
    bg.put(("members", [view_of(record(1))]))
    time.sleep(0.2)                              # within the first write's rest (9 x 0.05 s at a tenth)
    return list(sink.members_seen), bg


def test_a_sink_keeps_to_its_share_of_a_core_until_close():
    """A write that costs CPU is followed by a rest of cost * (1/share - 1); close ends the rests."""
    seen, bg = two_writes(cpu_share=0.1)
    assert seen == ["mlp-000"]
    bg.close(True, wait=5)                       # no more resting: the second goes out at once
    assert bg.sink.members_seen == ["mlp-000", "mlp-001"] and bg.dropped == 0


def test_a_sink_with_a_whole_core_never_rests():
    seen, bg = two_writes(cpu_share=1.0)
    assert seen == ["mlp-000", "mlp-001"]
    bg.close(True, wait=5)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs the tracking extra")
def test_event_records_are_framed_as_tensorboards_own_writer_frames_them(tmp_path):
    import io

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c
    from tensorboard.summary.writer.record_writer import RecordWriter

    from ensemble.results.tensorboard_sink import _crc32c, records
    payloads = [b"", b"brain.Event:2", bytes(range(256)) * 3]
    theirs = io.BytesIO()
    writer = RecordWriter(theirs)
    for data in payloads:
        writer.write(data)
    assert records(payloads, crc32c) == theirs.getvalue()              # TensorBoard's pure-Python CRC
    assert records(payloads, _crc32c()) == theirs.getvalue()           # the one the sink uses


def test_a_full_queue_drops_instead_of_blocking():
    release = threading.Event()

    class Stuck(Flaky):
        def members(self, views):
            release.wait(5)

    bg = Background(Stuck(0), queue_size=2, batch_seconds=0.0, give_up_seconds=30, cpu_share=1.0)
    t0 = time.monotonic()
    for i in range(10):
        bg.put(("members", [view_of(record(i))]))
    assert time.monotonic() - t0 < 1.0 and bg.dropped >= 7      # put never waits on the sink
    release.set()
    bg.close(True, wait=5)


@pytest.mark.parametrize("key, value", [("mlflow", "http://127.0.0.1:1"), ("tensorboard", True)])
def test_a_missing_extra_is_a_config_error_naming_it(monkeypatch, key, value):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == key else real(name, *a))
    with pytest.raises(ConfigError, match=rf'`tracking.{key}`.*pip install "mpi-ensemble\[tracking\]"'):
        config(**{key: value})
    assert not config().tracking.tensorboard and config().tracking.mlflow == ""     # off: nothing is needed


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "/tmp/mlruns", "mlruns"])
def test_an_mlflow_file_store_is_a_config_error(monkeypatch, uri):
    """MLflow 3 refuses a file store: `check` passed it, and the run retried every write, waited its
    finish_seconds and dropped them."""
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=r"`tracking.mlflow` = .* is a file store, which MLflow 3 refuses"):
        config(mlflow=uri)
    assert config(mlflow="sqlite:////tmp/m.db").tracking.mlflow == "sqlite:////tmp/m.db"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert config(mlflow=uri).tracking.mlflow == uri


@needs_tb
def test_a_writer_that_dies_stops_tracking_with_one_warning(tmp_path, caplog):
    tracking = Tracking(config(tensorboard=True), tmp_path, {"task": "classification"})
    tracking.proc.kill()
    tracking.proc.wait()
    with caplog.at_level(logging.WARNING, logger="ensemble.tracking"):
        for i in range(5):
            tracking.results([record(i)])
            tracking.sent_at = 0.0                          # send now, not in 0.5 s
            tracking.results([])
        tracking.finish({})
        tracking.close()
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "writer process ended" in warnings[0]
    assert tracking.dropped >= 5 and tracking.proc is None


@needs_tb
@pytest.mark.slow             # starts the writer process
def test_members_gathered_before_a_lull_go_out_while_the_master_waits(tmp_path, monkeypatch):
    """The master gathers members for ``SEND_SECONDS``; when no further result comes, its
    idle calls hand them to the writer (not the next result, which may be hours away)."""
    from ensemble.results import tracking as module
    tracking = Tracking(config(tensorboard=True, batch_seconds=0.05), tmp_path, {"task": "classification"})
    try:
        monkeypatch.setattr(module, "SEND_SECONDS", 3600.0)
        tracking.results([record(0)])
        tracking.results([record(1)])
        tracking.idle()
        assert len(tracking.views) == 2                # gathered, not yet due
        monkeypatch.setattr(module, "SEND_SECONDS", 0.01)
        folder = tmp_path / "tensorboard" / "members" / "mlp-001"
        deadline = time.monotonic() + 60
        while not folder.exists() and time.monotonic() < deadline:
            tracking.idle()
            time.sleep(0.05)
        assert not tracking.views and list(folder.glob("events.out.tfevents.*"))
    finally:
        tracking.close()

