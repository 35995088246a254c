"""A failed member's cause comes first, and a data file gone stops the run (``train.member.root_cause``,
``results.records.fatal_failure``, ``runtime.budget``)."""

from __future__ import annotations

from ensemble.results.records import DATA_UNREADABLE_KIND, FATAL_STOP, MemberRecord, Status, fatal_failure
from ensemble.runtime.budget import RunBudget
from ensemble.train.member import failure_record, root_cause

#: what TensorFlow raises when a Python generator under tf.data raised (shortened)
WRAPPED = """Graph execution error:

Detected at node PyFunc defined at (most recent call last):
  File "/work/main/datafeed/streaming.py", line 400, in chunks
Traceback (most recent call last):

  File "/usr/lib/python3.11/site-packages/tensorflow/python/ops/script_ops.py", line 269, in __call__
    ret = func(*args)

FileNotFoundError: [Errno 2] No such file or directory: '/data/shards/x_005.npy'


\t [[{{node PyFunc}}]]"""


class UnknownError(Exception):
    """Stands for tf.errors.UnknownError (its class name is what a record's kind reads)."""


def test_a_data_file_gone_under_tensorflow_is_named_first_and_is_data_unreadable():
    """A shard deleted mid-run failed every later member as "UnknownError: Graph execution error",
    with the FileNotFoundError buried in 50 lines of TensorFlow's trace."""
    kind, message = root_cause(UnknownError(WRAPPED))
    assert kind == DATA_UNREADABLE_KIND
    assert message.startswith("the data could not be read: FileNotFoundError: [Errno 2] No such file or directory: "
                              "'/data/shards/x_005.npy'")
    other = UnknownError(WRAPPED.replace("FileNotFoundError", "ValueError"))
    kind, message = root_cause(other)
    assert kind == "UnknownError" and message.startswith("ValueError: [Errno 2]") and "Graph execution" in message
    assert root_cause(ValueError("plain")) == ("ValueError", "plain")
    own = RuntimeError("the builder says:\nKeyError: 'width'")          # a message of its own, not TensorFlow's
    assert root_cause(own) == ("RuntimeError", str(own))
    try:
        raise UnknownError(WRAPPED)
    except UnknownError as exc:
        record = failure_record({"id": "m-003", "seed": 1}, exc, 0.0)
    assert record["status"] == Status.FAILED.value and record["error"]["kind"] == DATA_UNREADABLE_KIND


def test_a_member_whose_data_is_gone_stops_the_run_at_once():
    budget = RunBudget(None, 0.0, 0.9)
    gone = MemberRecord("m-003", Status.FAILED, error={"kind": DATA_UNREADABLE_KIND, "message": "the data could "
                                                                                         "not be read: x"})
    assert fatal_failure(MemberRecord("m-001", Status.FAILED, error={"kind": "ValueError"})) is None
    budget.observe(False, 1.0, fatal_failure(gone))
    assert budget.should_stop() and budget.failures_stopped and FATAL_STOP in budget.reason
    assert "m-003: the data could not be read: x" in budget.reason and "--resume" in budget.reason
