"""The detect loop's periodic tasks: when each is due, and how long an idle loop may sleep."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuguard.agent.reload import RULE_FILE_CHECK_S

GUARD_CHECK_S = 2.0  # evaluate the guard policies this often
LOOP_WAIT_MAX_S = 2.0  # an idle loop sleeps until its next deadline, at most this long
COALESCE_S = 0.1  # a periodic task this close to its deadline runs now, with the others due


class Schedule:
    """Named periodic tasks; each period is read when the task runs (a reload may change it).
    The rule-file check (``rules``) and the guard policies (``guard``) have fixed periods.

    Every task keeps to one grid from the same start (its next deadline is its last one plus
    its period, not "now" plus it): a late wake-up does not shift a task, so tasks whose
    periods are multiples of each other stay due in the same wake-up."""

    def __init__(self, first_in_s: float = 1.0, **periods: Callable[[], float]) -> None:
        self.periods = {"rules": lambda: RULE_FILE_CHECK_S, "guard": lambda: GUARD_CHECK_S}
        self.periods.update(periods)
        start = time.monotonic() + first_in_s
        self.next = dict.fromkeys(self.periods, start)
        self.soon = 0.0  # the moment this turn counts as "now" (its tasks due within COALESCE_S)

    def wait_s(self) -> float:
        """How long an idle loop may sleep: until the first deadline (items, a stop or a SIGHUP
        wake it sooner), at most LOOP_WAIT_MAX_S."""
        return max(0.0, min(min(self.next.values()) - time.monotonic(), LOOP_WAIT_MAX_S))

    def turn(self) -> float:
        """Start a turn; tasks due within COALESCE_S of each other run in one wake-up."""
        mono = time.monotonic()
        self.soon = mono + COALESCE_S
        return mono

    def due(self, name: str) -> bool:
        """Whether ``name`` runs this turn; if so, its next deadline is one period on (from now
        when the loop fell a whole period behind)."""
        if self.soon < self.next[name]:
            return False
        period = self.periods[name]()
        following = self.next[name] + period
        self.next[name] = following if following > self.soon else time.monotonic() + period
        return True
