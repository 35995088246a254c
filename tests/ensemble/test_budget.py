"""The master's stop rules: failure share and wall-time deadline."""

from ensemble.runtime.budget import RunBudget


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def ok(seconds=10.0):
    return (True, seconds)


FAILED = (False, 1.0)


def test_failure_share_stops_only_after_enough_failures():
    b = RunBudget(None, 30, 0.5, clock=Clock())
    for r in [FAILED, FAILED]:
        b.observe(*r)
    assert not b.should_stop()                     # 2 of 2 failed, but too few to judge
    b.observe(*FAILED)
    assert b.should_stop() and "3 of the first 3 members to end failed" in b.reason and "max_failed_share" in b.reason


def test_failure_share_tolerates_a_minority():
    b = RunBudget(None, 30, 0.5, clock=Clock())
    for r in [ok(), ok(), ok(), FAILED, FAILED, FAILED, ok()]:
        b.observe(*r)
    assert not b.should_stop()


def test_deadline_leaves_room_for_one_more_member_and_the_reserve():
    clock = Clock()
    b = RunBudget(time_limit=100, finish_reserve=20, max_failed_share=1.0, clock=clock)
    b.observe(*ok(30))
    clock.t += 40                      # 40 s used; one more member (30 s) ends at 70 < 80
    assert not b.should_stop()
    clock.t += 15                      # 55 + 30 > 80
    assert b.should_stop() and "time limit" in b.reason


def test_member_time_limit_is_capped_to_the_deadline_and_slurm_end_wins_when_sooner():
    clock = Clock()
    b = RunBudget(time_limit=1000, finish_reserve=10, max_failed_share=1.0, clock=clock, end_time=1100.0)
    spec = {"id": "a", "member_time_limit": 600.0}
    assert b.cap(spec)["member_time_limit"] == 90.0 and spec["member_time_limit"] == 600.0
    assert RunBudget(None, 10, 1.0, clock=clock).cap(spec) is spec


def test_a_spec_held_ahead_is_trimmed_or_handed_back_when_it_starts():
    """specs_in_hand > 1: a spec handed out at 1000 s may start seconds later; its worker trims its
    limit to the deadline then, and past the latest start (deadline less a member's time) hands it back."""
    from ensemble.runtime.executor import UNSTARTED, on_start
    clock = Clock()
    b = RunBudget(time_limit=100, finish_reserve=10, max_failed_share=1.0, clock=clock)   # deadline 1090
    b.observe(*ok(20.0))
    spec = b.cap({"id": "a", "member_time_limit": 600.0})
    assert spec["member_time_limit"] == 90.0 and spec["ends_by"] == 1090.0 and spec["start_by"] == 1070.0
    assert on_start(spec, now=1000.0) == spec                                  # at once: as handed out
    assert on_start(spec, now=1050.0)["member_time_limit"] == 40.0             # held 50 s: 40 s are left
    assert on_start(spec, now=1071.0)[UNSTARTED]                               # too late to end in time
    assert on_start({"id": "b", "member_time_limit": 5.0}, now=9e9)["member_time_limit"] == 5.0   # no deadline
