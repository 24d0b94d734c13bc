"""A straggler's suspects: those the rules recorded where Prometheus runs them (so the report names
what the alert names), else judged by the report with the rules' own clauses (lockstep/suspects.py).
On the fake Prometheus (tests/support/fake_prometheus.py); the real path is the report e2e."""

from __future__ import annotations

from lockstep import suspects as S
from lockstep.report.evidence import evidence
from lockstep.report.model import Straggler
from lockstep.report.prometheus import Prometheus
from lockstep.report.scope import Scope
from tests.support.fake_prometheus import FakePrometheus, Rule, series, serving, vector

NODE = "10.0.0.1:12400"
GPU_INFO = {"__name__": "lockstep_slurm_job_gpu_info", "instance": NODE, "uuid": "GPU-3", "gpu": "3"}
MOUNT_HUNG = Rule(r"^min_over_time\(lockstep_filesystem_responsive\{instance=", vector(({"mountpoint": "/home"}, 0)))
PFC_LOW = Rule(  # 1 % of the time paused: under the suspect's 2 %
    r"^rate\(lockstep_pfc_pause_seconds_total\{instance=",
    vector(({"interface": "ens3f0np0", "priority": "3", "direction": "rx"}, 0.01)),
)
THROTTLED = Rule(
    r"^avg_over_time\(lockstep_gpu_clock_event_active\{reason=~",
    vector(({"uuid": "GPU-3", "reason": "hw_slowdown"}, 0.4)),
)


def straggler() -> Straggler:
    return Straggler(kind="training", rank="3", host="", node=NODE, start=1000.0, end=2000.0)


def judged(fake: FakePrometheus) -> Straggler:
    with serving(fake):
        scope = Scope(Prometheus(fake.url), "4242", None, start=0.0, end=2000.0, window=60.0)
        scope.hosts = {NODE: "node001"}
        scope.labels = [GPU_INFO]
        s = straggler()
        evidence(scope, s)
    return s


def test_without_the_rules_the_report_judges_the_rules_clauses_itself() -> None:
    s = judged(FakePrometheus([MOUNT_HUNG, PFC_LOW, THROTTLED]))
    # A mount unresponsive at one scrape is a hung mount, as the rule says (the report wanted two).
    assert s.suspects == ["gpu_throttle", "hung_mount"]
    assert s.evidence == ["GPU 3 throttled (hw_slowdown) 40% of the time", "mount /home hung"]
    assert s.gpu == "3"


def test_where_the_rules_record_the_report_names_what_they_recorded() -> None:
    recorded = [
        Rule(rf"^series {S.SLOW_RANK_SOURCE}\{{", series({"__name__": S.SLOW_RANK_SOURCE, "rank": "3"})),
        Rule(rf"max_over_time\({S.RANK_SUSPECT}\{{rank=\"3\"", vector(({"suspect": "pfc_pause"}, 1))),
        Rule(rf"max_over_time\({S.NODE_SUSPECT}\{{instance=", vector(({"suspect": "pfc_pause"}, 1))),
    ]
    s = judged(FakePrometheus([*recorded, MOUNT_HUNG, PFC_LOW, THROTTLED]))
    # The rules saw PFC pauses over their 30 minutes, not the hung mount or the throttled GPU:
    # the report names exactly that, with what it saw of it (under the threshold in its own
    # shorter window: the rule's name for it).
    assert s.suspects == ["pfc_pause"]
    assert s.evidence == ["pfc pause (named by the straggler rules)"]
    assert s.gpu == ""  # a throttled GPU the rules did not name is not taken for the rank's


def test_where_the_rules_record_a_throttled_gpu_of_the_job_on_the_node_is_read_from_them() -> None:
    recorded = [
        Rule(rf"^series {S.SLOW_RANK_SOURCE}\{{", series({"__name__": S.SLOW_RANK_SOURCE, "rank": "3"})),
        Rule(
            rf"max_over_time\({S.GPU_THROTTLE}\{{instance=.*and on \(uuid\) lockstep_slurm_job_gpu_info",
            vector(({"uuid": "GPU-3"}, 0.4)),
        ),
    ]
    s = judged(FakePrometheus([*recorded, MOUNT_HUNG, THROTTLED]))
    assert (s.suspects, s.evidence) == (["gpu_throttle"], ["GPU 3 throttled (hw_slowdown) 40% of the time"])


def test_each_clause_renders_for_the_rules_and_for_one_node() -> None:
    (pfc,) = next(x for x in S.NODE_SUSPECTS if x.name == "pfc_pause").clauses
    assert pfc.rule() == "rate(lockstep_pfc_pause_seconds_total[30m]) > 0.02"
    assert S.render(pfc.expr, 'instance="a:1"', "5m") == 'rate(lockstep_pfc_pause_seconds_total{instance="a:1"}[5m])'
    cpu = next(x for x in S.NODE_SUSPECTS if x.name == "cpu_pressure").clauses[0]
    assert S.render(cpu.expr, 'instance="a:1"', "5m") == (
        'rate(lockstep_host_pressure_stalled_seconds_total{resource="cpu", kind="some", instance="a:1"}[5m])'
    )
    assert cpu.say({}, 0.31) == "CPU pressure (some) 31% of the time"
    assert pfc.say({"interface": "eth0"}, 0.05) == "PFC pause on eth0 priority ? 5% of the time (?)"
