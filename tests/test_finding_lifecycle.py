"""The process-finding lifecycle policy (gpuguard/agent/stages/s5_report/findings.py) over real correlator states.

The end-to-end run on the real kernel is tests/test_agent_finding_lifecycle.py; here the
policy's edges are walked with a clock the test moves: the rate limit, coalescing,
escalations, acting once per level, the close and its totals.
"""

from __future__ import annotations

import psutil
import pytest

from gpuguard.agent.config import AgentConfig, load_config
from gpuguard.agent.stages.s5_report.findings import ProcessFindings, finding_id
from gpuguard.correlate.state import ProcessKey, ProcessState
from gpuguard.detect.scoring.score import Evidence, Verdict
from gpuguard.errors import GpuguardError
from gpuguard.events.model import ConnActivity
from gpuguard.outputs.finding import finding_from_verdict
from gpuguard.sources.proc.pod_names import PodNames

KEY = ProcessKey(4242, 1_700_000_000.25)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_100.0  # doubles as the epoch "now" the loop passes

    def __call__(self) -> float:
        return self.now


def _verdict(verdict: str, *rules: str, tags: tuple[str, ...] = ()) -> Verdict:
    weight = {"clean": 10, "suspicious": 50, "malicious": 90}[verdict]
    evidence = [Evidence(r, "s", "d", weight // max(1, len(rules)), "high", tags) for r in rules]
    return Verdict(KEY, KEY.pid, "xmrig", "/tmp/xmrig", weight, verdict, evidence, time=1.0)


def _tracker(interval: float = 30.0) -> tuple[ProcessFindings, Clock, ProcessState]:
    clock = Clock()
    state = ProcessState(key=KEY, comm="xmrig", exe="/tmp/xmrig")
    return ProcessFindings(interval, "gpu-node-7", None, clock), clock, state


def _poll(tracker: ProcessFindings, state: ProcessState, clock: Clock, final: bool = False):
    clock.now += 1.0  # past the poll spacing
    return tracker.poll(lambda key: state if key == KEY else None, clock.now, final)


def test_create_then_one_coalesced_update_per_interval():
    tracker, clock, state = _tracker(30.0)
    create = tracker.scored(_verdict("malicious", "miner-cmdline-stratum"), state, clock.now)
    assert (create.activity, create.sequence, create.act) == ("create", 0, True)
    assert create.finding.finding_id == finding_id("gpu-node-7", KEY.pid, KEY.start_time)
    state.add_gpu_device("nvidia", "/dev/nvidia0")
    assert _poll(tracker, state, clock) == []  # grown, but within the interval
    state.add_connection("203.0.113.7", 3333)
    verdict = _verdict("malicious", "miner-cmdline-stratum", "net-pool-protocol")
    assert tracker.scored(verdict, state, clock.now) is None  # same level: no record, no act
    clock.now += 30.0
    (update,) = _poll(tracker, state, clock)
    assert (update.activity, update.sequence, update.act) == ("update", 1, False)
    assert update.changes == ["rules", "destination", "gpu"]
    assert _poll(tracker, state, clock) == []  # nothing new since
    state.add_gpu_device("nvidia", "/dev/nvidia1")
    assert _poll(tracker, state, clock) == []  # the next one waits for the interval again
    assert [w.changes for w in _poll(tracker, state, clock, final=True)] == [["gpu"]]


def test_updates_are_timed_at_their_write_so_their_times_keep_the_interval():
    """The loop's ``now`` is its pass's start; a pass that enriched for long writes later than
    that.  Record times are the writes', so two updates read an interval apart in the log."""
    clock = Clock()
    state = ProcessState(key=KEY, comm="xmrig", exe="/tmp/xmrig")
    tracker = ProcessFindings(8.0, "gpu-node-7", None, clock, wall=clock)
    tracker.scored(_verdict("suspicious", "a"), state, clock.now)
    clock.now += 1.0
    escalation = tracker.scored(_verdict("malicious", "a", "b"), state, clock.now - 0.05)
    times = [tracker.stamp(_stamped(escalation, state), escalation).created]
    state.add_gpu_device("nvidia", "/dev/nvidia0")
    clock.now += 9.0
    pass_start = clock.now - 0.3  # this pass spent 0.3 s on enrichment before it polled
    (update,) = tracker.poll(lambda key: state, pass_start)
    times.append(tracker.stamp(_stamped(update, state), update).created)
    assert times[1] - times[0] == pytest.approx(9.0)  # not 8.75: the limit and the log agree


def _stamped(write, state):
    return finding_from_verdict(write.verdict, None, None, state)


def test_an_escalation_is_written_at_once_and_acted_on_once():
    tracker, clock, state = _tracker(30.0)
    assert tracker.scored(_verdict("suspicious", "a"), state, clock.now).act
    escalation = tracker.scored(_verdict("malicious", "a", "b"), state, clock.now)
    assert (escalation.activity, escalation.act) == ("update", True)
    assert escalation.changes == ["escalation", "rules"]
    # back down and up again: an update when due, never another action for a level it had
    assert tracker.scored(_verdict("suspicious", "a"), state, clock.now) is None
    assert tracker.scored(_verdict("malicious", "a", "b"), state, clock.now) is None
    clock.now += 30.0
    assert [(w.act, w.changes) for w in _poll(tracker, state, clock)] == []  # same as said


def test_clean_verdicts_open_nothing_but_a_gpu_abuse_rule_does():
    tracker, clock, state = _tracker()
    assert tracker.scored(_verdict("clean", "x"), state, clock.now) is None
    note = tracker.scored(_verdict("clean", "gpu-raw-bar", tags=("gpu-abuse",)), state, clock.now)
    assert (note.activity, note.act) == ("create", False)
    assert tracker.scored(_verdict("suspicious", "gpu-raw-bar"), state, clock.now).act


def test_the_close_carries_lifetime_totals():
    tracker, clock, state = _tracker()
    tracker.scored(_verdict("malicious", "a"), state, clock.now)
    tracker.note_action(KEY.pid, KEY.start_time, "kill", "done", clock.now)
    tracker.note_action(99, KEY.start_time, "kill", "done", clock.now)  # another process
    state.add_gpu_device("nvidia", "/dev/nvidia0")
    state.add_connection("203.0.113.7", 3333)
    _poll(tracker, state, clock)  # the GPU is seen from here on
    state.gpu_memory.add(clock.now, 6 << 30)
    session = dict(time=clock.now, pid=KEY.pid, fd=5, remote="203.0.113.7:3333")
    state.add_session(ConnActivity(**session, bytes_out=1000, bytes_in=5000))
    _poll(tracker, state, clock)
    state.sessions.clear()  # the connection closed: its bytes are still counted
    state.add_session(ConnActivity(**dict(session, fd=6), bytes_out=24, bytes_in=0))
    state.exited_at, state.exit_code = clock.now + 5.0, 0
    (close,) = _poll(tracker, state, clock)
    assert (close.activity, close.sequence, close.exit_code) == ("close", 1, 0)
    totals = close.totals
    assert totals["age_s"] == round(state.exited_at - KEY.start_time, 3)
    assert totals["gpu_s"] == 6.0 and totals["gpu_memory_peak"] == 6 << 30
    assert (totals["bytes_out"], totals["bytes_in"]) == (1024, 5000)
    assert totals["destination"] == "203.0.113.7:3333"
    assert [a["action"] for a in totals["actions"]] == ["kill"] and totals["actions_total"] == 1
    assert len(tracker) == 0 and _poll(tracker, state, clock) == []


def test_a_stamped_record_names_the_image_it_runs_now():
    tracker, clock, state = _tracker()
    write = tracker.scored(_verdict("malicious", "a"), state, clock.now)
    state.comm, state.exe = "miner", "/opt/miner"  # an exec seen after the facts were read
    finding = tracker.stamp(finding_from_verdict(write.verdict, None, None, state), write)
    assert (finding.process.name, finding.process.executable) == ("miner", "/opt/miner")
    assert finding.record_id == f"{write.finding.finding_id}-0"
    (update,) = _poll(tracker, state, Clock(), final=True)
    assert update.changes == ["exec"]


def test_a_process_the_correlator_forgot_is_closed_only_once_it_ended():
    tracker, clock, _ = _tracker()
    me = psutil.Process()
    key = ProcessKey(me.pid, round(me.create_time(), 2))  # this test: running
    verdict = _verdict("malicious", "a")
    verdict.key = key
    tracker.scored(verdict, None, clock.now)
    clock.now += 1.0
    assert tracker.poll(lambda k: None, clock.now) == [] and len(tracker) == 1
    gone = ProcessKey(me.pid, key.start_time - 50.0)  # its pid, an earlier start: ended
    verdict.key = gone
    tracker.scored(verdict, None, clock.now)
    clock.now += 1.0
    (close,) = tracker.poll(lambda k: None, clock.now)
    assert close.finding.key == gone and close.activity == "close"


def test_the_update_interval_is_an_agent_setting(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("findings:\n  update_interval_s: 5\n")
    path.chmod(0o600)
    assert load_config(path).finding_update_interval_s == 5
    assert AgentConfig().finding_update_interval_s == 30.0
    path.write_text("findings:\n  update_interval_s: -1\n")
    with pytest.raises(GpuguardError, match=r"agent.yaml:2:\d+: findings.update_interval_s -1"):
        load_config(path)


def test_records_name_the_pod_and_container_the_kubelet_knows(tmp_path):
    uid, cid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "c0ffee" * 10 + "abcd"
    (tmp_path / "pods" / f"ml-team_trainer-7_{uid}").mkdir(parents=True)
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"trainer-7_ml-team_worker-{cid}.log").touch()
    clock = Clock()
    tracker = ProcessFindings(30.0, "gpu-node-7", None, clock, PodNames(str(tmp_path)))
    state = ProcessState(key=KEY, comm="xmrig", exe="/tmp/xmrig")
    write = tracker.scored(_verdict("malicious", "a"), state, clock.now)
    finding = finding_from_verdict(write.verdict, None, None, state)
    finding.process.pod_uid, finding.process.container_id = uid, cid
    tracker.stamp(finding, write)
    p = finding.process
    assert (p.pod_namespace, p.pod_name, p.container_name) == ("ml-team", "trainer-7", "worker")


def test_a_closed_finding_is_never_opened_again_while_its_process_is_held():
    """An ended process's finding is closed once; a later verdict about it (a reload, a parent's
    change) writes nothing and acts on nothing, until the correlator forgets the process."""
    tracker, clock, state = _tracker()
    tracker.scored(_verdict("malicious", "miner-cmdline-stratum"), state, clock.now)
    state.exited_at = clock.now
    (close,) = _poll(tracker, state, clock)
    assert close.activity == "close" and len(tracker) == 0
    assert tracker.scored(_verdict("malicious", "miner-cmdline-stratum"), state, clock.now) is None
    assert _poll(tracker, state, clock) == []
    tracker.forget_closed(lambda key: state)  # still held: still closed
    assert tracker.scored(_verdict("malicious", "a", "b"), state, clock.now) is None
    tracker.forget_closed(lambda key: None)  # forgotten: the bookkeeping goes with it
    assert tracker._closed == set()


def _own_key() -> ProcessKey:
    """This test process: a key that is running (carried findings must be)."""
    import os

    return ProcessKey(os.getpid(), round(psutil.Process().create_time(), 2))


def test_a_finding_an_earlier_run_left_open_is_continued_numbered_on_and_marked():
    from gpuguard.agent.stages.s5_report.findings import Carried

    key = _own_key()
    gone = ProcessKey(key.pid, key.start_time - 100.0)  # that pid, an earlier process: ended
    clock = Clock()
    tracker = ProcessFindings(30.0, "gpu-node-7", None, clock, run_id="0a1b2c3d4e5f")
    fid = finding_id("gpu-node-7", key.pid, key.start_time)
    old = finding_id("gpu-node-7", gone.pid, gone.start_time)
    tracker.carry({fid: Carried(key, 3), old: Carried(gone, 7)})
    assert set(tracker.ledger()) == {fid}  # the ended one is not carried on
    state = ProcessState(key=key, comm="xmrig", exe="/tmp/xmrig")
    verdict = Verdict(key, key.pid, "xmrig", "/tmp/xmrig", 90, "malicious", [], time=1.0)
    create = tracker.scored(verdict, state, clock.now)
    assert (create.activity, create.sequence, create.continued, create.act) == (
        "create", 4, True, True,
    )  # fmt: skip
    stamped = tracker.stamp(finding_from_verdict(verdict, None, None, state), create)
    assert stamped.record_id == f"{fid}-0a1b2c3d4e5f-4" and stamped.continued
    assert tracker.ledger() == {fid: Carried(key, 4)} and not tracker.changed
    state.add_connection("203.0.113.7", 3333)
    clock.now += 31.0
    (update,) = tracker.poll(lambda k: state, clock.now)
    assert (update.sequence, update.continued) == (5, False)  # only the pick-up is marked
    assert tracker.changed and tracker.ledger()[fid].sequence == 5


def test_a_new_finding_is_not_marked_continued_and_the_ledger_follows_the_open_set():
    tracker, clock, state = _tracker()
    create = tracker.scored(_verdict("malicious", "a"), state, clock.now)
    assert (create.sequence, create.continued) == (0, False)
    assert list(tracker.ledger()) == [create.finding.finding_id]
    state.exited_at = clock.now
    _poll(tracker, state, clock)
    assert tracker.changed and tracker.ledger() == {}


def test_the_ledger_file_round_trips_and_a_damaged_one_is_one_line_not_a_crash(tmp_path):
    from gpuguard.agent.stages.s5_report.finding_ledger import ledger_path, load_ledger, save_ledger
    from gpuguard.agent.stages.s5_report.findings import Carried

    path = ledger_path(tmp_path / "status.json")
    assert path == tmp_path / "status.findings.json"
    assert load_ledger(path) == ({}, None)  # first run: nothing to continue
    carried = {"gpuguard-" + "b" * 31: Carried(ProcessKey(42, 1_700_000_000.25), 6)}
    save_ledger(path, "0a1b2c3d4e5f", carried)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert load_ledger(path) == (carried, None)
    path.write_text('{"version": 1, "findings": [{"id": "x", "pid": "not a pid"}]')
    found, problem = load_ledger(path)
    assert found == {} and problem.startswith("cannot read the open findings of the last run")
    path.write_text('{"version": 1, "findings": [{"id": "x", "pid": "nan?"}, 5]}')
    assert load_ledger(path) == ({}, None)  # damaged rows cost their own continuation only


def test_a_continued_finding_is_picked_up_whatever_its_verdict_now_and_closed_at_the_end():
    """A restarted agent may not see again what convicted a process (a pool login happens
    once): the finding is still continued, not acted on while clean, and closed when it ends."""
    from gpuguard.agent.stages.s5_report.findings import Carried

    key = _own_key()
    clock = Clock()
    tracker = ProcessFindings(30.0, "gpu-node-7", None, clock, run_id="0a1b2c3d4e5f")
    fid = finding_id("gpu-node-7", key.pid, key.start_time)
    tracker.carry({fid: Carried(key, 2)})
    state = ProcessState(key=key, comm="xmrig", exe="/tmp/xmrig")
    clean = Verdict(key, key.pid, "xmrig", "/tmp/xmrig", 0, "clean", [], time=1.0)
    other = ProcessKey(key.pid + 100_000, key.start_time)  # clean and carried by no one
    assert (
        tracker.scored(Verdict(other, other.pid, "x", "/x", 0, "clean", [], time=1.0), None, 1)
        is None
    )
    create = tracker.scored(clean, state, clock.now)
    assert (create.activity, create.sequence, create.continued, create.act) == (
        "create", 3, True, False,
    )  # fmt: skip
    state.exited_at = clock.now
    (close,) = tracker.poll(lambda k: state, clock.now + 1.0)
    assert (close.activity, close.sequence) == ("close", 4) and tracker.ledger() == {}
