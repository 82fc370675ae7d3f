"""The detect loop's periodic tasks: when each is due, and how long an idle loop may sleep."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gpuguard.agent.reload import RULE_FILE_CHECK_S

GUARD_CHECK_S = 2.0  # evaluate the guard policies this often
LOOP_WAIT_MAX_S = 2.0  # a loop sleeps until its next deadline, at most this long
COALESCE_S = 0.1  # a periodic task this close to its deadline runs now, with the others due
# A loop whose last IDLE_TURNS turns brought no news (no item that wakes it: a quiet GPU sample
# is none) is idle: the checks that only look for change (rule files, guard policies, the state
# file) run IDLE_STRETCH times less often, on a grid that meets the 10 s housekeeping, and it
# sleeps up to IDLE_STRETCH times longer.  The first news ends that at once.
IDLE_TURNS = 3
IDLE_STRETCH = 5
STRETCHED = frozenset(("rules", "guard", "status"))


class Schedule:
    """Named periodic tasks; each period is read when the task runs (a reload may change it).
    The rule-file check (``rules``) and the guard policies (``guard``) have fixed periods.

    Every task keeps to one grid from the same start (its next deadline is its last one plus
    its period, not "now" plus it): a late wake-up does not shift a task, so tasks whose
    periods are multiples of each other stay due in the same wake-up, unless one is kept
    half a step off (:meth:`half_step`).  An idle loop runs the STRETCHED tasks on the grid
    of IDLE_STRETCH periods from that start (:meth:`news`)."""

    def __init__(
        self,
        first_in_s: float = 1.0,
        most_idle_wait_s: Callable[[], float] = lambda: math.inf,
        **periods: Callable[[], float],
    ) -> None:
        self.periods = {"rules": lambda: RULE_FILE_CHECK_S, "guard": lambda: GUARD_CHECK_S}
        self.periods.update(periods)
        self.start = time.monotonic() + first_in_s
        self.next = dict.fromkeys(self.periods, self.start)
        self.apart: set[str] = set()  # tasks kept half a period off the common grid
        self.soon = 0.0  # the moment this turn counts as "now" (its tasks due within COALESCE_S)
        self.quiet_turns = 0  # turns in a row without news
        # an idle loop's longest sleep, beside its stretch: the health check must see it turn
        self.most_idle_wait_s = most_idle_wait_s

    def half_step(self, name: str, apart: bool) -> None:
        """Keep ``name`` half its period off the common grid (``apart``), or back on it: two
        tasks that each cost a few ms then run in different wake-ups instead of adding up in
        one, for one wake-up more per period.  Either way its next run is half a period later,
        never sooner, and each later one keeps to the grid it is on."""
        if apart != (name in self.apart):
            self.apart ^= {name}
            self.next[name] += self.periods[name]() / 2

    @property
    def idle(self) -> bool:
        return self.quiet_turns >= IDLE_TURNS

    def news(self, came: bool) -> None:
        """Whether this turn brought news.  News ends idleness at once: each stretched task is
        due again at the next mark of its own grid."""
        if not came:
            self.quiet_turns += 1
            if self.quiet_turns == IDLE_TURNS:  # now idle: each stretched task to its idle grid
                for name in STRETCHED & self.next.keys():
                    step = self.periods[name]() * IDLE_STRETCH
                    ahead = max(0.0, self.next[name] - self.start)
                    self.next[name] = self.start + math.ceil(ahead / step) * step
            return
        if self.idle:
            mono = time.monotonic()
            for name in STRETCHED & self.next.keys():
                period = self.periods[name]()
                mark = self.start + math.ceil(max(0.0, mono - self.start) / period) * period
                self.next[name] = min(self.next[name], mark)
        self.quiet_turns = 0

    def wait_s(self) -> float:
        """How long the loop may sleep: until the first deadline (items, a stop or a SIGHUP wake
        it sooner), at most LOOP_WAIT_MAX_S, or ``most_idle_wait_s`` when idle."""
        most = LOOP_WAIT_MAX_S
        if self.idle:
            most = max(most, min(most * IDLE_STRETCH, self.most_idle_wait_s()))
        return max(0.0, min(min(self.next.values()) - time.monotonic(), most))

    def turn(self, news: bool = True) -> float:
        """Start a turn (``news``: whether it brought any, see :meth:`news`); tasks due within
        COALESCE_S of each other run in one wake-up."""
        self.news(news)
        mono = time.monotonic()
        self.soon = mono + COALESCE_S
        return mono

    def due(self, name: str) -> bool:
        """Whether ``name`` runs this turn; if so, its next deadline is one period on (from now
        when the loop fell a whole period behind)."""
        if self.soon < self.next[name]:
            return False
        period = self.periods[name]()
        if self.idle and name in STRETCHED:  # the next mark of the stretched grid
            period *= IDLE_STRETCH
            following = (
                self.start + (math.floor((self.next[name] - self.start) / period) + 1) * period
            )
        else:
            following = self.next[name] + period
        self.next[name] = following if following > self.soon else time.monotonic() + period
        return True
