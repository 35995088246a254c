"""A stuck rank ends itself (``ensemble.runtime.watchdog``): never a hang."""

from __future__ import annotations

import threading
import time

from ensemble.runtime.watchdog import EXIT_STUCK, STUCK_GRACE, Watchdog, stuck_seconds


def test_work_past_its_bound_logs_the_stacks_and_exits_stuck(capfd):
    ended = threading.Event()
    codes: list[int] = []

    def exit(code: int) -> None:
        codes.append(code)
        ended.set()

    with Watchdog(0.05, "m-001 is stuck", exit=exit) as dog:
        assert ended.wait(5)
    err = capfd.readouterr().err
    assert dog.fired and codes == [EXIT_STUCK] and "error: m-001 is stuck" in err and "every thread's stack" in err


def test_work_within_its_bound_or_without_one_is_left_alone():
    codes: list[int] = []
    with Watchdog(5.0, "never", exit=codes.append) as dog:
        time.sleep(0.01)
    time.sleep(0.05)
    with Watchdog(None, "no bound", exit=codes.append):
        pass
    assert codes == [] and not dog.fired


def test_a_members_bound_is_twice_its_time_limit_and_a_grace():
    assert stuck_seconds(600) == 1200 + STUCK_GRACE and stuck_seconds(2) == 64 and stuck_seconds(0.001) > 60
    assert stuck_seconds(None) is None and stuck_seconds(0) is None
