"""End to end on a real Prometheus: the alert rules fire on the simulated node's faults, and only
there, and every dashboard query runs and returns data.

One Prometheus (Debian `prometheus`, started here on a free port with a temporary storage dir)
scrapes one `lockstep demo --scenario X` per case every 5 s, each target labelled
cluster=<case>: the scenarios, a healthy node whose kubernetes collector fails, and a target
nobody listens on (agent-down).  It loads the generated rule files, rendered with two test-only
changes (alerts/compression.py Compression):

- durations are compressed: every `for:` 30 times (10m becomes 20 s) and to no more than 30 s
  (LockstepFilesystemAlmostFull's 30m), every range
  window and offset 10 times but to no less than 30 s, six steps of the simulated clock ([5m]
  becomes [30s]).  rate() divides by the whole window, so a 5-minute window over one minute of
  data would read a fifth of the rate;
- time() is shifted by the distance between now and the simulated node's wall clock, which
  starts at 2026-01-02T00:00:00Z (simulation/storage.py EPOCH), so the age of the last
  checkpoint is the age the node sees.

While the scenarios run, the test polls the alerts API every second and keeps, per target,
every alert seen firing.  Each target's expected alerts are a table entry (CASES); a
scenario that `lockstep demo --help` does not list yet (the workload collectors' `straggler` and
`kv-pressure`) is skipped, not failed.  The demo advances simulated time 5 s every 5 s, and the
collectors run every 5 s here, once per step of the clock.

The scale-out path (VictoriaMetrics, vmagent, vmalert) watches a subset of these cases in the
same run, from the same demos, for tests/simulation/test_scale_out_e2e.py (tests/support/observation.py
alerts_run).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from alerts import rules
from alerts.compression import Compression
from lockstep import thresholds as T
from lockstep.node_faults import GPUS_LOST_RECORD, NODE_FAULTS, THROTTLE_REASONS
from tests.support.observation import (
    CASES,
    COLLECTOR_INTERVAL,
    DEADLINE,
    EVALUATION_INTERVAL,
    ONLY,
    PROVEN_ELSEWHERE,
    Run,
    dashboard_problems,
    failed_scrapes,
    instant_query,
    rule_file_alerts,
)
from tests.support.observation import (
    SCRAPE_SECONDS as SCRAPE,
)
from tests.support.queries import checked_in


@pytest.fixture(scope="module")
def run(alerts_run: Run) -> Iterator[Run]:
    """The session's one observation of the cases (tests/support/observation.py)."""
    yield alerts_run
    report(alerts_run)


def _describe(run: Run, cluster: str) -> str:
    fired = "\n".join(f"  {dict(labels)} (after {s} s)" for labels, s in run.fired.get(cluster, {}).items())
    log = run.logs.get(f"demo-{cluster}")
    tail = log.read_text()[-2000:] if log else ""
    return f"fired in {cluster}:\n{fired or '  nothing'}\n{failed_scrapes(run, cluster)}\ndemo log tail:\n{tail}"


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.e2e
def test_each_case_fires_its_alerts_and_no_others(run: Run, name: str) -> None:
    if ONLY and name not in ONLY:
        pytest.skip("not in LOCKSTEP_E2E_CASES")
    if name not in run.scenarios:
        pytest.skip(f"`lockstep demo --help` does not list scenario {CASES[name].demo!r} yet (the workload collectors)")
    wanted = CASES[name].expected
    fired = run.firing(name)
    # Each within DEADLINE of the run's start (the run watches longer when the scale-out path
    # waits for its warm-up).
    missing = [e for e in wanted if not any(e.matches(a) for a in run.firing(name, within=DEADLINE))]
    unexpected = [a for a in fired if not any(e.matches(a) for e in wanted)]
    assert (missing, unexpected) == ([], []), _describe(run, name)
    # Nothing else is on its way either: no other alert is pending at the end of the run.
    pending = [
        a["labels"]
        for a in run.at_end
        if a["labels"].get("cluster") == name and not any(e.matches(a["labels"]) for e in wanted)
    ]
    assert pending == [], _describe(run, name)


@pytest.mark.e2e
def test_no_alert_fires_outside_the_cases(run: Run) -> None:
    """Every alert carries its case's cluster label (aggregations keep it)."""
    assert set(run.fired) <= set(run.scenarios), {k: list(v) for k, v in run.fired.items()}


# The node record's faults each faulty case's agent shows (lockstep/node_faults.py): (case, record,
# its labels besides cluster and instance) -> count.  The run is minutes long, within every record's
# window: each series counts what it holds, as the simulation made it (simulation/gpu.py
# gpu-faults: XIDs 48 and 13 once each, 2 uncorrectable ECC errors, 8 rows remapped; gpu-lost:
# GPU 5, and its XID 79).
OWN_FAULTS = {
    ("gpu-faults", "instance:lockstep_node_xid_errors:increase7d", (("xid", "13"),)): 1,
    ("gpu-faults", "instance:lockstep_node_xid_errors:increase7d", (("xid", "48"),)): 1,
    ("gpu-faults", "instance:lockstep_node_ecc_uncorrected_errors:increase7d", ()): 2,
    ("gpu-faults", "instance:lockstep_node_remapped_rows:increase7d", (("cause", "uncorrectable"),)): 8,
    ("gpu-lost", "instance:lockstep_node_gpus_lost:max7d", ()): 1,
    ("gpu-lost", "instance:lockstep_node_xid_errors:increase7d", (("xid", "79"),)): 1,
}
# The flapping port's downs and the throttled GPUs' seconds grow as the run goes: each record is
# what the agent's counter held when the rule read it (between its value two scrapes before the
# evaluation and at it: a loaded machine's scrape may land after the evaluation it precedes).
GROWING = {
    (
        "link-flap",
        "instance:lockstep_node_link_downs:increase7d",
    ): "sum by (cluster) (lockstep_ib_port_link_downed_total)",
    ("gpu-throttle", "instance:lockstep_node_gpu_throttled_seconds:increase7d"): (
        f'sum by (cluster, reason) (lockstep_gpu_clock_event_seconds_total{{reason=~"{"|".join(THROTTLE_REASONS)}"}})'
    ),
}
KEPT = ("cluster", "instance", "__name__", "job", "node")  # the labels a record's key leaves out


def _recorded(run: Run, expr: str, at: float) -> dict[tuple[str, str, tuple[tuple[str, str], ...]], float]:
    return {
        (
            r["metric"]["cluster"],
            r["metric"].get("__name__", ""),
            tuple(sorted((k, v) for k, v in r["metric"].items() if k not in KEPT)),
        ): float(r["value"][1])
        for r in instant_query(run.prometheus, expr, at)["data"]["result"]
    }


@pytest.mark.e2e
def test_the_node_record_counts_each_nodes_own_faults(run: Run) -> None:
    """The node record's faults on the real agents' series: exactly what each faulty case made,
    nothing on any other case (the healthy node, the near misses)."""
    if ONLY:
        pytest.skip("LOCKSTEP_E2E_CASES runs only some cases")
    names = "|".join([*(fault.record for fault in NODE_FAULTS), GPUS_LOST_RECORD])
    found = _recorded(run, f'{{__name__=~"{names}"}}', run.observed_at)
    fixed = {key: value for key, value in found.items() if (key[0], key[1]) not in GROWING}
    assert fixed == OWN_FAULTS
    growing = {key: value for key, value in found.items() if (key[0], key[1]) in GROWING}
    assert {(cluster, record) for cluster, record, _ in growing} == set(GROWING)
    for (cluster, record, labels), value in growing.items():
        matchers = ", ".join(f'{k}="{v}"' for k, v in (("cluster", cluster), *labels))
        selector = f"{record}{{{matchers}}}"
        evaluated = float(
            instant_query(run.prometheus, f"timestamp({selector})", run.observed_at)["data"]["result"][0]["value"][1]
        )
        counter = GROWING[cluster, record]
        held = [
            _recorded(run, counter, at).get((cluster, "", labels), 0.0) for at in (evaluated - 2 * SCRAPE, evaluated)
        ]
        assert held[0] <= value <= held[1], f"{record} {labels} of {cluster}: {value}, its counter {held}"


@pytest.mark.e2e
def test_a_stalled_save_names_its_writer_in_the_node_record(run: Run) -> None:
    """Issue 45: the checkpoint-stall case's save, stalled under its job's root on its one agent,
    names that node as the job's slow writer (alerts/nodes.py), and the node's record counts the
    job; no other case names a writer."""
    if ONLY:
        pytest.skip("LOCKSTEP_E2E_CASES runs only some cases")
    seconds = int(run.duration + 120)
    wrote = _recorded(run, f"max_over_time({T.NODE_CHECKPOINT_WRITER_RECORD}[{seconds}s])", run.observed_at)
    assert {(cluster, dict(labels).get("job_id")) for cluster, _, labels in wrote} == {("checkpoint-stall", "4242")}
    hurt = _recorded(run, f'{T.NODE_JOBS_HURT_RECORD}{{cluster="checkpoint-stall"}}', run.observed_at)
    assert list(hurt.values()) == [1.0]


@pytest.mark.parametrize("title", sorted(checked_in()))
@pytest.mark.e2e
def test_every_dashboard_query_runs_and_returns_data(run: Run, title: str) -> None:
    problems = dashboard_problems(checked_in()[title], run.prometheus, run.observed_at)
    # A series that is missing may be one whose agent's last scrape failed (its series then go stale).
    failed = [f"{name}: {failed_scrapes(run, name)}" for name in run.scenarios] if problems else []
    assert problems == [], "\n".join(line for line in failed if "none" not in line)


@pytest.mark.e2e
def test_every_alert_in_the_rule_files_fires_in_some_case(run: Run) -> None:
    """An alert no simulated fault fires is proven only on hand-written series: add a scenario
    and a case for it (see CASES).  That every alert is expected by some case, and every scenario
    is a case, are unit-tier checks (tests/alerts/test_alert_cases.py)."""
    if ONLY:
        pytest.skip("LOCKSTEP_E2E_CASES runs only some cases")
    fired = {dict(labels)["alertname"] for seen in run.fired.values() for labels in seen}
    assert sorted(rule_file_alerts() - fired - set(PROVEN_ELSEWHERE)) == []


def _seconds(duration: str) -> int:
    return int(duration.removesuffix("s"))


def detection_bound(compression: Compression, alertname: str) -> float:
    """The alert's 'for' plus its longest range window (its recording rules' included) plus two
    refreshes of the data, as rendered for this run (seconds)."""
    recorded = {r.record: compression.expr(r.expr) for r in rules.recordings()}
    alert = next(a for a in rules.alerts() if a.name == alertname)

    def windows(expr: str) -> list[int]:
        # last_over_time's range is a lookback for the last value seen, it delays nothing.
        expr = re.sub(r"last_over_time\(([^\[]*)\[\d+s\]\)", r"\1", expr)
        found = [_seconds(w) for w in re.findall(r"\[(\d+s)\]", expr)]
        for name, text in recorded.items():
            if name in expr:
                found += windows(text)
        return found

    # Two refreshes of the data: in production the scrape interval (15 s) is at least the
    # collectors' (10-15 s); here scrapes come every 5 s and the data changes as often (the
    # demo's clock step and the collectors' interval), so a refresh is 5 s.
    # And one rule evaluation, which comes every EVALUATION_INTERVAL.
    refresh = max(1.0, float(COLLECTOR_INTERVAL.removesuffix("s")))
    longest = max(windows(compression.expr(alert.expr)), default=0)
    return _seconds(compression.for_(alert.for_)) + longest + 2 * refresh + _seconds(EVALUATION_INTERVAL)


def time_to_detect(run: Run) -> list[tuple[str, str, float, float]]:
    """(case, alert, seconds from the fault to firing, bound) for every expected alert that fired."""
    rows = []
    for name in run.scenarios:
        for wanted in sorted(CASES[name].expected, key=lambda e: e.alertname):
            fault_at = run.demo_started[name] + (CASES[name].onset if wanted.onset is None else wanted.onset)
            times = [t for labels, t in run.fired.get(name, {}).items() if wanted.matches(dict(labels))]
            if times:
                detected = round(min(times) - fault_at, 1)
                rows.append((name, wanted.alertname, detected, detection_bound(run.compression, wanted.alertname)))
    return rows


def report(run: Run) -> None:
    """Printed after the module's tests (a report, not a test: the checks are the tests above):
    when each alert fired, the time to detect each fault against its bound (the alert's 'for' +
    window + 2 scrape intervals, compressed as in this run), and how long the run took (pytest -s
    shows it)."""
    for cluster in run.scenarios:
        for labels, seconds in sorted(run.fired.get(cluster, {}).items(), key=lambda item: item[1]):
            print(f"e2e: {cluster}: {dict(labels)['alertname']} firing after {seconds} s")
    print("e2e: time to detect (s), fault -> firing, against for + window + 2 refreshes + 1 evaluation:")
    for name, alertname, detected, bound in time_to_detect(run):
        note = "" if detected <= bound else "  (over)"
        print(f"e2e-ttd: | {name} | {alertname} | {detected:.1f} | {bound:.0f} |{note}")
    for cluster, seen in sorted(run.vm_fired.items()):
        for labels, seconds in sorted(seen.items(), key=lambda item: item[1]):
            print(f"e2e: scale-out: {cluster}: {dict(labels)['alertname']} firing after {seconds} s")
    print(f"e2e: {len(run.scenarios)} targets observed for {run.duration:.0f} s")
