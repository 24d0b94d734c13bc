"""The alert cases of the simulated node and their observation on a real Prometheus: every case
once (alerts_run, the conftest's session fixture for tests/alerts/test_alerts_e2e.py), SCALE_OUT_CASES
on the VictoriaMetrics path too in the same run, from the same demos (for
tests/simulation/test_scale_out_e2e.py).  See tests/alerts/test_alerts_e2e.py's docstring."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alerts import render
from alerts.compression import Compression
from lockstep.simulation.gpu import XID_AT
from lockstep.simulation.storage import EPOCH
from lockstep.simulation.timeline import FRAMEWORK_SLOW_AT
from lockstep.simulation.workloads import INFERENCE_ONSET
from tests.support import REPO, http_get, lockstep, scale_out
from tests.support.prometheus import Stack, query_alerts
from tests.support.queries import WORKLOAD_CONTRACT, declared_metrics, panel_queries, variable_queries

# Prometheus scrapes every 5 s, with as long to answer: the data changes every 5 s (the demo's
# clock step and the collectors' interval), and twenty demos on a 2-core machine answer a short
# timeout late and then count as down.  Rules every 2 s: the shortest compressed 'for' is 2 s.
SCRAPE_INTERVAL = "5s"
EVALUATION_INTERVAL = "2s"
# No compressed 'for' shorter than four scrapes (production's shortest, 1m, is four 15-s scrapes).
# At 1/30 alone LockstepAgentDown's 5m was 10 s, two scrapes: a demo that answered two scrapes
# late while others started paged as down (CI, 2026-11-29: the kubernetes case's demo).
SCRAPE_SECONDS = int(SCRAPE_INTERVAL.removesuffix("s"))
MIN_FOR = 4 * SCRAPE_SECONDS
# Demos started at once while the others serve (see observe()).  Six at once starved the demos
# serving already: 1-3 of the last ten to start missed two scrapes in a row (LockstepAgentDown,
# its 5m then compressed to 10 s) in each of five runs here.
DEMOS_STARTING = 3
COLLECTOR_INTERVAL = "5s"  # the demo advances its clock every 5 s: collecting more often reads the same data
# Longer than the interval: twenty demos share the machine with whatever else runs, and a round
# that takes 6 s on a busy machine is slow, not failed (a GPU collector stuck in a hung NVML is
# reported after this long).
COLLECTOR_DEADLINE = "15s"
# After every expected alert fired, keep watching at least this long, so that an unexpected
# alert had the time to fire too: the compressed windows filled (30 s) and the 'for' of most
# alerts (up to 10m -> 20 s, MIN_FOR at least) over.  An alert with a longer 'for' whose condition holds shows
# as pending at the end, which fails the scenario as well.
SETTLE = 50
DEADLINE = 150  # seconds for every expected alert to fire
# While working on a scenario: LOCKSTEP_E2E_CASES=name,name runs only those cases (the test that
# every alert fires somewhere is skipped then).
ONLY = {name for name in os.environ.get("LOCKSTEP_E2E_CASES", "").split(",") if name}


@dataclass(frozen=True)
class Expect:
    alertname: str
    labels: tuple[tuple[str, str], ...] = ()
    onset: float | None = None  # seconds into the demo when this fault begins, if not the case's

    def matches(self, alert: dict[str, str]) -> bool:
        return alert["alertname"] == self.alertname and all(alert.get(k) == v for k, v in self.labels)


def expect(alertname: str, onset: float | None = None, **labels: str) -> Expect:
    return Expect(alertname, tuple(sorted(labels.items())), onset)


@dataclass(frozen=True)
class Case:
    """One target of the run: a demo scenario (None: no agent listens), extra demo arguments
    ({tmp} is the run's temporary directory), and the alerts it must fire, and nothing else.
    onset: seconds into the demo when the fault begins (0: there from the start), from which
    the time to detect is measured."""

    demo: str | None
    expected: frozenset[Expect]
    args: tuple[str, ...] = ()
    onset: float = 0.0


def case(demo: str | None, *expected: Expect, args: tuple[str, ...] = (), onset: float = 0.0) -> Case:
    return Case(demo, frozenset(expected), args, onset)


# Each case's target is labelled cluster=<case name>.  The scenarios, the other scenarios
# of the simulated node (which must fire what they simulate and nothing more), and two faults
# made around a healthy node: a collector that fails, and an agent that is not there.
#
# A new alert: a scenario of the simulated node that produces its fault, and an entry here naming
# what it fires (docs/development.md, "Adding an alert").  tests/alerts/test_alert_cases.py fails
# (unit tier) until every alert of alerts/ is expected here and every scenario is a case;
# test_every_alert_in_the_rule_files_fires_in_some_case until every alert fires.
CASES: dict[str, Case] = {
    "healthy": case("healthy"),
    "straggler": case(
        "straggler",
        expect("LockstepTrainingStraggler"),
        expect("LockstepTrainingStragglerSustained"),
        expect("LockstepTrainingSlowerThanPeers"),
        expect("LockstepGPUStraggler", gpu="3"),
        expect("LockstepGPUStragglerSustained", gpu="3"),
    ),
    # Requests queue for a KV-cache slot: p95 time to first token ~5 s, over the 2-s SLO.
    "kv-pressure": case(
        "kv-pressure",
        expect("LockstepKVCachePressure"),
        expect("LockstepKVCachePreemptions"),
        expect("LockstepInferenceTTFTHigh"),
    ),
    # Issue 15's inference alerts: 30 s into the demo the vLLM server slows down (its tokens a
    # second against its level before) or fails requests; the near miss loses its demand instead.
    "inference-slow": case(
        "inference-slow",
        expect("LockstepInferenceThroughputDrop"),
        expect("LockstepInferenceTTFTHigh"),
        onset=INFERENCE_ONSET,
    ),
    "inference-errors": case("inference-errors", expect("LockstepInferenceErrors"), onset=INFERENCE_ONSET),
    "inference-quiet": case("inference-quiet"),
    "checkpoint-stall": case(
        "checkpoint-stall", expect("LockstepCheckpointStalled", root="/lustre/ckpt/job=4242"), expect("LockstepIOStall")
    ),
    # The lost GPU's rank never finishes a step: job 4242 stalls.
    "gpu-lost": case(
        "gpu-lost",
        expect("LockstepGPUFellOffBus", gpu="5"),
        expect("LockstepTrainingStalled"),
        expect("LockstepNodeNeedsRepair"),
    ),
    "pfc-storm": case("pfc-storm", expect("LockstepPFCStorm", interface="ens3f0np0")),
    "link-flap": case(
        "link-flap",
        expect("LockstepIBLinkFlapping", device="mlx5_3", port="1"),
        expect("LockstepIBSymbolErrors", device="mlx5_3", port="1"),
    ),
    "nfs-server-down": case("nfs-server-down", expect("LockstepFilesystemHung", mountpoint="/home")),
    # Issue 17's five faults, each with a near miss that must stay silent.
    "training-hang": case("training-hang", expect("LockstepTrainingStalled", job_id="4242")),
    "training-finished": case("training-finished"),
    "gpu-nvml-hang": case(
        "gpu-nvml-hang",
        expect("LockstepGPUFellOffBus", collector="gpu"),
        expect("LockstepNodeNeedsRepair"),
        onset=10,
    ),
    "gpu-throttle": case(
        "gpu-throttle",
        expect("LockstepGPUThermalSlowdown", gpu="2"),
        expect("LockstepGPUPowerBrake", gpu="5"),
        onset=10,
    ),
    "shared-fs-filling": case("shared-fs-filling", expect("LockstepFilesystemAlmostFull", mountpoint="/lustre")),
    # The other alerts' faults.
    "checkpoint-overdue": case("checkpoint-overdue", expect("LockstepCheckpointOverdue", root="/lustre/ckpt/job=4242")),
    # The XID and the ECC errors come XID_AT (20 s) in; the other faults are there from the start.
    "gpu-faults": case(
        "gpu-faults",
        expect("LockstepGPUXidCritical", onset=XID_AT, gpu="1", xid="48"),
        expect("LockstepGPUUncorrectableECC", onset=XID_AT, gpu="2"),
        expect("LockstepGPURowRemapFailure", gpu="4"),
        expect("LockstepNVLinkDown", gpu="6", link="3"),
        expect("LockstepNVLinkErrors", gpu="7"),
        expect("LockstepNodeNeedsRepair"),
    ),
    "fabric-faults": case(
        "fabric-faults",
        expect("LockstepIBPortDown", device="mlx5_1", port="1"),
        expect("LockstepIBCongestion", device="mlx5_2", port="1"),
        expect("LockstepRoCECongestionControlOff", interface="ens3f1np1"),
    ),
    # Issue 13: a job holding two GPUs it does not use; near miss: the same GPUs idle and free.
    "idle-gpu": case(
        "idle-gpu",
        expect("LockstepGPUIdleWhileAllocated", gpu="6", job_id="4242"),
        expect("LockstepGPUIdleWhileAllocated", gpu="7", job_id="4242"),
    ),
    "idle-gpu-free": case("idle-gpu-free"),
    "gpu-recovery": case(
        "gpu-recovery",
        expect("LockstepGPURecoveryActionRequired", gpu="4", action="drain_and_reset"),
        expect("LockstepNodeNeedsRepair"),
    ),
    # GPU 5's route recovery in progress is the near miss.
    "gpu-fabric-degraded": case(
        "gpu-fabric-degraded", expect("LockstepGPUFabricDegraded", gpu="2", condition="degraded_bandwidth")
    ),
    "gpu-mig": case("gpu-mig"),
    # GPU 2 trained at x8 (busy), HCA mlx5_5 a generation down.  Its near miss is training-finished,
    # whose idle GPUs run their links at Gen1 to save power: no alert.
    "pcie-degraded": case(
        "pcie-degraded",
        expect("LockstepPCIeLinkDegraded", gpu="2", degraded="width"),
        expect("LockstepPCIeLinkDegraded", device="mlx5_5", degraded="generation"),
    ),
    "gpu-volta": case("gpu-volta"),
    # GPU 6 is held through a DRA claim by a pod that runs nothing on it: idle while allocated.
    "kubernetes": case(
        "kubernetes",
        expect("LockstepGPUIdleWhileAllocated", gpu="6", k8s_namespace="inference", k8s_pod="embeddings-6b7c9-w4kxd"),
    ),
    # The kubelet's pod-resources directory exists but its socket does not: the kubernetes
    # collector fails every round.
    "collector-failing": case(
        "healthy",
        expect("LockstepCollectorFailing", collector="kubernetes"),
        args=("--kubernetes.pod-resources-socket", "{tmp}/kubelet/kubelet.sock"),
    ),
    "agent-down": case(None, expect("LockstepAgentDown")),
    # Issue 27: NCCL's own telemetry, for a job whose step logs say nothing.  The straggler's near
    # miss: ranks that arrive last in turn; the hang's: a job that ended (its communicators gone).
    "nccl-straggler": case("nccl-straggler", expect("LockstepNCCLStraggler", job_id="4242", rank="5")),
    "nccl-jitter": case("nccl-jitter"),
    "nccl-hang": case(
        "nccl-hang",
        expect("LockstepNCCLHang", job_id="4242"),
        expect("LockstepNCCLRankStuck", job_id="4242", rank="13"),
    ),
    "nccl-finished": case("nccl-finished"),
    # Issue 37: job 4242 seen through its framework's output alone.  It printed its last report
    # 12 minutes before the demo (stall); its steps take 1.5x as long from FRAMEWORK_SLOW_AT.
    "framework-stall": case("framework-stall", expect("LockstepFrameworkStalled", job_id="4242")),
    "framework-slowdown": case(
        "framework-slowdown",
        expect("LockstepFrameworkSlowdown", job_id="4242", framework="torchtitan"),
        onset=FRAMEWORK_SLOW_AT,
    ),
    # Issue 35's hang scenarios (hang-*) are not cases of this run: their windows (2 minutes of
    # evidence, a 6-minute save or evaluation, the watchdog 10 minutes after the stop) are what
    # they prove, and this run's 30-s window floor and 30-times shorter 'for' would change them (a
    # 6-minute save turns into LockstepTrainingStalled, the hung rank's idle GPU into
    # LockstepGPUIdleWhileAllocated).  tests/alerts/test_hangs_e2e.py runs them at their own
    # timing; nccl-hang above names its dead rank here.
}

# The cases the scale-out path (VictoriaMetrics, vmagent, vmalert) watches too, one of each kind of
# rule (tests/simulation/test_scale_out_e2e.py): recording rules and fleet comparisons
# (straggler, kv-pressure), counters counted from their first sample (pfc-storm, link-flap: see
# tests/support/scale_out.py on MetricsQL's increase()), time() against a timestamp
# (checkpoint-overdue), a target that stops answering and one never there (gpu-lost, agent-down),
# NCCL's collectives and hangs (nccl-straggler, nccl-hang: the Slurm job dashboard's NCCL panels),
# a GPU's own faults (gpu-faults, gpu-throttle: the fleet dashboard's "Nodes' own faults"), and a
# healthy node that must fire nothing.  Every case on both paths at once is more than a
# 2-core machine runs on time; the rules' PromQL is the same for every case.
SCALE_OUT_CASES = (
    "healthy",
    "straggler",
    "kv-pressure",
    "pfc-storm",
    "link-flap",
    "checkpoint-overdue",
    "gpu-lost",
    "agent-down",
    "nccl-straggler",
    "nccl-hang",
    "gpu-faults",
    "gpu-throttle",
)

# Alerts no case of this run can reach, and the tests that prove them on the real agent instead.
PROVEN_ELSEWHERE = {
    # The step-log hang: proven on hang-steps at the workload's own timing.
    "LockstepTrainingHung": "tests/alerts/test_hangs_e2e.py (hang-steps)",
    # Fires after the hung job's end, 10 minutes after the stop (PyTorch's watchdog): longer than
    # this run.  Proven at the workload's own timing, as are the hangs' twins.
    "LockstepJobEndedHung": "tests/alerts/test_hangs_e2e.py, tests/alerts/test_alerts_replay.py (hang-killed)",
    # A week of several jobs' alerts: proven on a 64-node fleet's backfilled alert history.
    "LockstepNodeHurtsJobs": "tests/alerts/test_node_record_e2e.py",
}


def rule_file_alerts() -> set[str]:
    """Every alert in the rule files of alerts/, whoever added it."""
    names = set()
    for path in render.RULE_FILES.values():
        for group in yaml.safe_load((REPO / path).read_text())["groups"]:
            names |= {rule["alert"] for rule in group["rules"] if "alert" in rule}
    return names


def demo_scenarios() -> set[str]:
    """The scenarios `lockstep demo --help` lists."""
    result = lockstep("demo", "--help")
    assert result.returncode == 0, result.stderr
    listing = result.stdout.split("scenarios:\n", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^  (\S+)", listing, flags=re.M))


@dataclass
class Run:
    """What one end-to-end run saw."""

    prometheus: str
    scenarios: list[str]
    started: float
    compression: Compression
    fired: dict[str, dict[frozenset[tuple[str, str]], float]] = field(default_factory=dict)  # seconds in
    demo_started: dict[str, float] = field(default_factory=dict)  # per case: seconds in when its demo served
    at_end: list[dict[str, Any]] = field(default_factory=list)  # every alert (firing or pending) at the end
    logs: dict[str, Path] = field(default_factory=dict)
    duration: float = 0.0
    # The scale-out path (None without the victoria-metrics package) and the cases it scraped: what
    # vmalert fired.
    scale_out: scale_out.ScaleOut | None = None
    scaled_out: tuple[str, ...] = ()
    vm_fired: dict[str, dict[frozenset[tuple[str, str]], float]] = field(default_factory=dict)
    vm_at_end: list[dict[str, Any]] = field(default_factory=list)
    # Wall-clock seconds when the observation ended and the demos stopped: queries ask then.
    observed_at: float = 0.0

    def firing(self, cluster: str, within: float | None = None) -> list[dict[str, str]]:
        """The alerts seen firing for the case (within: that many seconds into the run at most)."""
        seen = self.fired.get(cluster, {})
        return [dict(labels) for labels, at in seen.items() if within is None or at <= within]

    def vm_firing(self, cluster: str) -> list[dict[str, str]]:
        return [dict(labels) for labels in self.vm_fired.get(cluster, {})]


def _record(fired: dict[str, dict[frozenset[tuple[str, str]], float]], alerts: list[dict[str, Any]], at: float) -> None:
    for alert in alerts:
        if alert["state"] == "firing":
            labels = alert["labels"]
            seen = fired.setdefault(labels.get("cluster", ""), {})
            seen.setdefault(frozenset(labels.items()), round(at, 1))


@contextmanager
def observe(tmp: Path, names: list[str], *, scaled_out: tuple[str, ...] = ()) -> Iterator[Run]:
    """Start a demo per case (and a real Prometheus scraping them, and for the cases scaled_out
    the VictoriaMetrics path beside it), watch the alerts until every expected one fired on both
    and the run settled, and yield what was seen; everything started is stopped on the way out."""
    (tmp / "kubelet").mkdir()
    config = tmp / "lockstep.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "collectors": {
                    name: {"interval": COLLECTOR_INTERVAL, "deadline": COLLECTOR_DEADLINE}
                    for name in builtin_collectors()
                }
            }
        )
    )
    stack: Stack | None = None
    vm: scale_out.ScaleOut | None = None
    try:
        # The simulated node's wall clock reads EPOCH when its demo starts.
        clock_offset = time.time() - EPOCH
        compression = Compression(
            for_scale=1 / 30, min_for=MIN_FOR, max_for=30, range_scale=1 / 10, min_range=30, clock_offset=clock_offset
        )
        rule_files = {Path(name).name: text for name, text in render.render_rule_files(compression).items()}
        stack = Stack(tmp, rule_files, scrape_interval=SCRAPE_INTERVAL, evaluation_interval=EVALUATION_INTERVAL)
        url = stack.url
        demos = {}
        # The scaled-out cases' demos start last (in the cases' order: gpu-faults among the last
        # three): vmalert starts WARMUP after the last demo served, and a fault a scaled-out demo
        # begins 20 s in (gpu-faults' XID and ECC counters, read by [10m] -> 60 s windows) must
        # still be in the window then.  Started among the 35 in the cases' order, gpu-faults
        # served long before the last demo on a loaded machine, and vmalert never saw its step
        # (a clean-clone run at c13ffcf).
        names = [name for name in names if name not in scaled_out] + [n for n in names if n in scaled_out]
        for name in names:
            demo = CASES[name].demo
            if demo is None:
                stack.absent(name, name)  # nothing listens on the port
                continue
            extra = [arg.format(tmp=tmp) for arg in CASES[name].args]
            demos[name] = (name, ["--scenario", demo, "--config", str(config), *extra])
        # A demo's simulated clock starts at 0 when it serves: its faults' onsets are counted
        # from then.  At most DEMOS_STARTING demos start at once: forty Python processes
        # importing and running their first rounds together took the 2 cores for ~20 s, and the
        # first demos to serve then missed scrapes (LockstepAgentDown).
        # Each is a target once it serves, so Prometheus sees it from its first seconds, before
        # any fault begins (a counter that already stepped at its first scrape reads no
        # increase), and a demo that starts late never counts as an agent down.
        ready = stack.start_demos(demos, register="serving", at_once=DEMOS_STARTING)

        scaled_out = tuple(name for name in scaled_out if name in stack.targets)
        if scaled_out:
            (tmp / "scale-out").mkdir()
            rule_paths = [tmp / name for name in rule_files]
            vm_targets = [stack.targets[name] for name in scaled_out]
            # Scraped and evaluated as often as Prometheus does: the vmagents scraping every second
            # rendered 5 times as many expositions on the 10 demos as Prometheus did.
            vm = scale_out.ScaleOut(
                tmp / "scale-out", vm_targets, rule_paths, SCRAPE_INTERVAL, EVALUATION_INTERVAL, stack.port
            )

        result = Run(url, names, time.monotonic(), compression, logs=stack.logs, scale_out=vm, scaled_out=scaled_out)
        vm_rules_at = result.started + scale_out.WARMUP
        # Seconds from the start of the observation (negative: before it); no agent: its start.
        result.demo_started = {name: round(ready.get(name, result.started) - result.started, 1) for name in names}
        expected = {name: CASES[name].expected for name in names}
        deadline = result.started + DEADLINE
        settle_until = result.started + SETTLE
        if vm is not None:  # vmalert starts after its warm-up, and then has its own deadline
            deadline = max(deadline, vm_rules_at + scale_out.RULES_DEADLINE)
            settle_until += scale_out.WARMUP
        while True:
            now = time.monotonic()
            _record(result.fired, query_alerts(url), now - result.started)
            if vm is not None:
                if vm.rules_started is None and now >= vm_rules_at:
                    vm.start_rules()
                _record(result.vm_fired, vm.alerts() or [], now - result.started)
            all_fired = all(
                any(e.matches(a) for a in result.firing(cluster))
                and (cluster not in scaled_out or any(e.matches(a) for a in result.vm_firing(cluster)))
                for cluster, wanted in expected.items()
                for e in wanted
            )
            if (all_fired and now >= settle_until) or now > deadline:
                break
            time.sleep(1)
        result.at_end = query_alerts(url)
        if vm is not None:
            at_end = vm.alerts(tries=3)
            assert at_end is not None, f"vmalert did not answer its alerts API 3 times in 10 s\n{vm.logs()}"
            result.vm_at_end = at_end
        result.duration = time.monotonic() - result.started
        # What the tests read from here on is stored: the alerts seen, and the data the dashboards'
        # queries ask for as it stood one scrape before now (observed_at): a scrape that began just
        # before the demos stop fails for the stop, and Prometheus marks every series of its target
        # stale from the scrape's start (a full run at f22eba9: no data for three demos' series
        # 0.1 s before the stop).  The demos and the scale-out writers stop: left running for the
        # rest of the session, 35 demos took the 2 cores from the report's run.
        result.observed_at = time.time() - SCRAPE_SECONDS
        stack.stop_demos()
        if vm is not None:
            vm.stop_writers()
        yield result
    finally:
        if vm is not None:
            vm.stop()
        if stack is not None:
            stack.stop()


def _needs_data(expr: str) -> bool:
    """A query on the workload collectors' metrics returns data only once they are merged."""
    pending = {name for name in WORKLOAD_CONTRACT if name not in declared_metrics()}
    families = {"_".join(name.split("_")[:2]) + "_" for name in pending}  # lockstep_training_, ...
    return not any(family in expr for family in families)


def substitute(expr: str) -> str:
    """The dashboards' variables as Grafana would fill them: every cluster and node, the simulated job."""
    for variable, value in (("$__rate_interval", "1m"), ("$cluster", ".*"), ("$node", ".*"), ("$job_id", "4242")):
        expr = expr.replace(variable, value)
    return expr


def instant_query(api: str, expr: str, at: float) -> dict[str, Any]:
    """A query of a Prometheus API (Prometheus or VictoriaMetrics) at wall-clock time `at`, with
    the HTTP status beside the answer."""
    status, body = http_get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at}), timeout=30)
    return {"http_status": status, **json.loads(body)}


def failed_scrapes(run: Run, cluster: str) -> str:
    """Prometheus' record of the case's scrapes that failed (up 0), each with its time into the run
    and how long the scrape took (5 s: it timed out; less: the agent answered, with an error or
    an exposition Prometheus rejected), and its targets' last error: what a LockstepAgentDown
    nobody expected needs to be told apart from a slow machine."""
    seconds = int(run.duration + 120)  # from before the first demo served
    lines = []
    for name in ("up", "scrape_duration_seconds"):
        answer = instant_query(run.prometheus, f'{name}{{cluster="{cluster}"}}[{seconds}s]', run.observed_at)
        for series in answer.get("data", {}).get("result", []):
            lines.append((name, series["metric"].get("instance", ""), series["values"]))
    ups = {instance: values for name, instance, values in lines if name == "up"}
    took = {
        (instance, t): v for name, instance, values in lines if name == "scrape_duration_seconds" for t, v in values
    }
    wall_start = run.observed_at + SCRAPE_SECONDS - run.duration
    failed = [
        f"  {instance} at {t - wall_start:.1f} s: up 0, took {float(took.get((instance, t), 'nan')):.2f} s"
        for instance, values in ups.items()
        for t, v in values
        if v == "0"
    ]
    _, body = http_get(f"{run.prometheus}/api/v1/targets", timeout=30)
    errors = [
        f"  {t['labels'].get('instance')}: last error {t.get('lastError')!r}"
        for t in json.loads(body).get("data", {}).get("activeTargets", [])
        if t["labels"].get("cluster") == cluster and t.get("lastError")
    ]
    return "failed scrapes:\n" + "\n".join(failed or ["  none"]) + ("\n" + "\n".join(errors) if errors else "")


def dashboard_problems(dashboard: dict[str, Any], api: str, at: float) -> list[str]:
    """Every panel query and variable of a dashboard run against a Prometheus API (Prometheus or
    VictoriaMetrics at ``api``) as the data stood at wall-clock time `at`: what failed or came
    back empty where data is expected."""
    problems = []
    for panel, expr in panel_queries(dashboard):
        answer = instant_query(api, substitute(expr), at)
        if answer["http_status"] != 200 or answer["status"] != "success":
            problems.append(f"{panel}: {answer.get('error')} in {expr}")
        elif not answer["data"]["result"] and _needs_data(expr):
            problems.append(f"{panel}: no data for {substitute(expr)}")
    for name, variable in variable_queries(dashboard).items():
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable)
        assert match, variable
        selector, label = substitute(match.group(1)), match.group(2)
        status, body = http_get(
            f"{api}/api/v1/label/{label}/values?"
            + urllib.parse.urlencode({"match[]": selector, "start": at - 300, "end": at}),
            timeout=30,
        )
        if status != 200 or not json.loads(body)["data"]:
            problems.append(f"variable {name}: no values for {variable}")
    return problems


def builtin_collectors() -> list[str]:
    from lockstep.agent.registry import discover

    return sorted(name for name, registered in discover().collectors.items() if registered.builtin)


def alerts_run(tmp: Path) -> Iterator[Run]:
    """Every case this version of the demo lists (LOCKSTEP_E2E_CASES: only those), observed once
    on a single Prometheus, and SCALE_OUT_CASES on the scale-out path beside it where the
    victoria-metrics package is installed: the vmagents scrape the same demos.

    One run for both (it was two, of 2.5 and 3.5 minutes): once a compressed 'for' could no
    longer be two scrapes (MIN_FOR), the 35 demos with the scale-out path beside them answered on
    time, where before 3-4 of the last demos to start read as agents down."""
    scaled_out = SCALE_OUT_CASES if scale_out.available() else ()
    with observe(tmp, listed(list(CASES)), scaled_out=scaled_out) as result:
        yield result


def listed(names: list[str]) -> list[str]:
    """The cases whose scenario `lockstep demo --help` lists (LOCKSTEP_E2E_CASES: only those)."""
    available = demo_scenarios()
    names = [name for name in names if CASES[name].demo is None or CASES[name].demo in available]
    return [name for name in names if name in ONLY] if ONLY else names
