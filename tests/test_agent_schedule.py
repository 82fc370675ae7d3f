"""The detect loop's periodic tasks keep to one grid, so an idle loop wakes once per period."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from gpuguard.agent import housekeeping, schedule
from gpuguard.agent.config import AgentConfig
from gpuguard.agent.housekeeping import heavy_pass
from gpuguard.agent.pipeline import Agent
from gpuguard.agent.schedule import Schedule
from gpuguard.sources.gpu import nvml
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml
from tests.support.agent_run import agent_running, until

TASKS = ("rules", "guard", "status", "housekeeping")


def _proc_agent(tmp_path, **config: object) -> Agent:
    """An in-process agent on the /proc sensor with one fake idle GPU."""
    fake = FakeNvml([FakeGpu()])
    return Agent(
        AgentConfig(
            sensor="proc",
            log_path=str(tmp_path / "agent.log"),
            status_path=tmp_path / "status.json",
            sweep_interval_s=60.0,
            **config,
        ),
        install_signals=False,
        stderr=lambda line: None,
        sampler_openers={"nvml": lambda: nvml.open_sampler(library=fake.module)},
    )


def test_a_late_wake_up_does_not_move_the_tasks_off_their_grid(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(schedule.time, "monotonic", lambda: clock[0])
    plan = Schedule(first_in_s=1.0, status=lambda: 2.0, housekeeping=lambda: 10.0)
    ran = {}
    for now in (101.3, 103.25, 105.0, 107.4, 109.0, 111.05):  # woken late, by up to 0.4 s
        clock[0] = now
        plan.turn()
        ran[now] = {name for name in TASKS if plan.due(name)}
        assert plan.wait_s() == pytest.approx(2.0 - (now - 101.0) % 2.0)  # to the next 2 s mark
    assert all(ran[now] >= {"rules", "guard", "status"} for now in ran)
    assert [now for now in ran if "housekeeping" in ran[now]] == [101.3, 111.05]
    clock[0] = 120.0  # a loop that fell a whole period behind starts again from now
    plan.turn()
    assert plan.due("rules")
    assert plan.next["rules"] == pytest.approx(122.0)  # not 115, at once due again


def test_the_state_file_check_shares_the_rule_check_wake_up_even_after_a_write_out_of_turn(
    tmp_path, monkeypatch
):
    turn, due = Schedule.turn, Schedule.due
    turns: list[set[str]] = []

    def counted_turn(self, **kw):
        turns.append(set())
        return turn(self, **kw)

    def noted_due(self, name):
        ran = due(self, name)
        if ran and turns:
            turns[-1].add(name)
        return ran

    monkeypatch.setattr(Schedule, "turn", counted_turn)
    monkeypatch.setattr(Schedule, "due", noted_due)
    monkeypatch.setattr(schedule, "IDLE_TURNS", 10**6)  # the busy grid (idle: the tests below)
    agent = _proc_agent(tmp_path, status_interval_s=0.5)
    with agent_running(agent):
        time.sleep(1.7)
        agent.ctx.status_soon = True  # a finding's write, between two checks
        agent.intake.nudge()
        time.sleep(1.6)
    checks = [names for names in turns if "rules" in names]
    assert len(checks) >= 2, turns
    assert all("status" in names for names in checks), turns  # one wake-up, not two


def test_a_state_file_is_stale_only_after_an_idle_agent_would_have_rewritten_it():
    from gpuguard.agent.status_file import STALE_AFTER_INTERVALS, STATUS_HEARTBEAT

    # an idle agent rewrites an unchanged file at a heartbeat, seen at its stretched look
    assert STALE_AFTER_INTERVALS >= STATUS_HEARTBEAT + schedule.IDLE_STRETCH + 1


def _quiet_loop(monkeypatch, **periods) -> tuple[Schedule, list[float]]:
    """A schedule on a clock the test moves (rules and guard 2 s, status 2 s, housekeeping 10 s)."""
    clock = [100.0]
    monkeypatch.setattr(schedule.time, "monotonic", lambda: clock[0])
    plan = Schedule(
        first_in_s=1.0,
        most_idle_wait_s=lambda: 10.0,
        status=lambda: 2.0,
        housekeeping=lambda: 10.0,
        **periods,
    )
    return plan, clock


def _quiet_turns(
    plan: Schedule,
    clock: list[float],
    until: float,
    tasks: tuple[str, ...] = TASKS,
    after_turn: Callable[[float, set[str]], None] = lambda now, ran: None,
    late: dict[float, float] | None = None,
) -> dict[float, set[str]]:
    """Turns without news from 101 s to ``until``, each woken when the schedule says (or at
    ``late[t]`` instead of t): the tasks each turn ran."""
    ran: dict[float, set[str]] = {}
    now = 101.0
    while now < until:
        clock[0] = now
        plan.turn(news=False)
        ran[now] = {name for name in tasks if plan.due(name)}
        after_turn(now, ran[now])
        now = round(now + plan.wait_s(), 6)
        now = (late or {}).get(now, now)
    return ran


def test_an_idle_loop_looks_five_times_less_often_and_news_ends_it_at_once(monkeypatch):
    plan, clock = _quiet_loop(monkeypatch)
    ran = _quiet_turns(plan, clock, until=135.0)
    # two turns on the busy grid; the third quiet one makes the loop idle, and from then on it
    # wakes once every 10 s: the stretched checks and housekeeping together, on the 10 s grid
    assert [t for t in ran if ran[t]] == [101.0, 103.0, 111.0, 121.0, 131.0]
    assert all(ran[t] == set(TASKS) for t in (111.0, 121.0, 131.0))
    assert plan.idle
    clock[0] = 132.3  # news: the stretched checks are due at their next 2 s mark
    plan.news(True)
    assert not plan.idle
    assert plan.next["rules"] == plan.next["status"] == pytest.approx(133.0)
    assert plan.wait_s() == pytest.approx(0.7)


def test_a_task_kept_half_a_step_off_runs_between_the_others_busy_or_idle(monkeypatch):
    # the agent's heavy housekeeping passes and its host checks with the state file each cost
    # a few ms: 5 s apart, neither adds to the other's wake-up (an idle loop wakes twice per
    # 10 s); back on the common grid, they share one wake-up again
    plan, clock = _quiet_loop(monkeypatch, host=lambda: 10.0)

    def housekeeping_ran(now: float, ran: set[str]) -> None:
        if "housekeeping" in ran:
            plan.half_step("housekeeping", now < 130.0)  # heavy passes, then light ones

    ran = _quiet_turns(
        plan,
        clock,
        until=155.0,
        tasks=(*TASKS, "host"),
        after_turn=housekeeping_ran,
        late={116.0: 116.3},  # one wake-up 0.3 s late: the next is still on the grid
    )
    common = {"rules", "guard", "status", "host"}
    assert [t for t in ran if ran[t]] == [
        *(101.0, 103.0, 111.0),  # the first pass, heavy: the next one half a period later
        *(116.3, 121.0, 126.0, 131.0, 136.0, 141.0),  # apart, 5 s off the others
        151.0,  # the pass at 136 was light: with the others again (half a period later)
    ]
    assert ran[101.0] >= {"housekeeping", "host"}
    assert all(ran[t] == {"housekeeping"} for t in (116.3, 126.0, 136.0))
    assert all(ran[t] == common for t in (111.0, 121.0, 131.0, 141.0))
    assert ran[151.0] == common | {"housekeeping"}


def test_a_pass_is_heavy_from_a_millisecond_and_light_again_below_half_of_one():
    assert not heavy_pass(0.0002, was_heavy=False)
    assert not heavy_pass(0.0009, was_heavy=False)
    assert heavy_pass(0.0012, was_heavy=False)
    assert heavy_pass(0.0007, was_heavy=True)  # no flapping around the threshold
    assert not heavy_pass(0.0003, was_heavy=True)


@pytest.mark.parametrize("heavy", [True, False])
def test_the_agent_keeps_heavy_housekeeping_off_the_host_checks_wake_up(
    tmp_path, monkeypatch, heavy
):
    plans: list[Schedule] = []
    made = Schedule.__init__

    def kept(self, *args, **kw):
        made(self, *args, **kw)
        plans.append(self)

    monkeypatch.setattr(Schedule, "__init__", kept)
    # every pass heavy, or none (a pass on this host may cost either)
    monkeypatch.setattr(housekeeping, "HEAVY_FROM_S", 0.0 if heavy else math.inf)
    monkeypatch.setattr(housekeeping, "LIGHT_BELOW_S", 0.0 if heavy else math.inf)
    agent = _proc_agent(tmp_path)
    config = agent.config
    with agent_running(agent):
        until(lambda: plans and plans[0].next["housekeeping"] > plans[0].start, timeout=15)
    plan = plans[0]
    host, every = config.host_check_interval_s, agent.housekeeping_s
    assert host == every  # one period: half a step apart means 5 s between them
    gap = (plan.next["housekeeping"] - plan.next["host"]) % host
    assert gap == pytest.approx(host / 2 if heavy else 0.0, abs=0.2), plan.next


def test_an_idle_loop_still_turns_within_the_health_checks_bound(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(schedule.time, "monotonic", lambda: clock[0])
    plan = Schedule(first_in_s=0.0, most_idle_wait_s=lambda: 4.0, housekeeping=lambda: 10.0)
    for _ in range(schedule.IDLE_TURNS - 1):
        plan.news(False)
    clock[0] = 100.05
    plan.turn(news=False)
    assert plan.idle
    assert {name for name in ("rules", "guard", "housekeeping") if plan.due(name)} == {
        "rules",
        "guard",
        "housekeeping",
    }
    assert plan.wait_s() == pytest.approx(4.0)  # health_stall_s / 3, not 10 s
