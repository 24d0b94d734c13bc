"""`lockstep report --node` as the CLI runs it (in-process) on a stand-in Prometheus: the usage it
refuses, a node in several clusters, and labels that would act on a terminal.  Its queries are
proven on a real Prometheus holding a fleet's week: tests/alerts/test_node_record_e2e.py."""

from __future__ import annotations

import json

import pytest

from lockstep.agent.cli import main
from lockstep.report.node import since_seconds, window
from tests.support.fake_prometheus import FakePrometheus, Rule, series, serving, vector


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [(), ("4242", "--node", "n07")])
def test_a_job_or_a_node_one_of_them(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    assert run(capsys, *args) == (2, "", "lockstep: report: give a JOB_ID or --node NAME (one of them)\n")


def test_save_is_for_a_jobs_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--node", "n07", "--save")
    assert (code, out, err) == (2, "", "lockstep: report: --save and --refresh are for a job's report, not --node\n")


def test_a_window_is_a_prometheus_duration(capsys: pytest.CaptureFixture[str]) -> None:
    assert [since_seconds(t) for t in ("7d", "36h", "90m", "1w", "45s")] == [604800, 129600, 5400, 604800, 45]
    assert [window(s) for s in (604800, 129600, 5400, 45)] == ["7d", "36h", "90m", "45s"]
    with pytest.raises(SystemExit) as exit:
        run(capsys, "--node", "n07", "--since", "a week")
    assert exit.value.code == 2
    assert "argument --since: 'a week' is not a duration such as 7d, 36h or 90m" in capsys.readouterr().err


def test_a_node_in_several_clusters_asks_for_one(capsys: pytest.CaptureFixture[str]) -> None:
    agents = series(*({"__name__": "lockstep_gpu_up", "instance": "n07:12400", "cluster": c} for c in ("a", "b")))
    with serving(FakePrometheus([Rule(r"^series \{", agents)])) as fake:
        code, out, err = run(capsys, "--node", "n07", "--prometheus", fake.url)
    assert (code, out) == (1, "")
    assert err == "lockstep: report: node n07 is in clusters a, b: choose one with --cluster\n"


def test_what_its_labels_hold_reaches_the_terminal_visibly(capsys: pytest.CaptureFixture[str]) -> None:
    """A job id is its user's to choose: an escape sequence in it is printed as text."""
    agent = {"__name__": "lockstep_gpu_up", "instance": "n07:12400", "cluster": "a"}
    alert = {"alertname": "LockstepTrainingStraggler", "job_id": "7\x1b]0;owned\x07", "instance": "n07:12400"}
    fake = FakePrometheus(
        [
            Rule(r"^series \{", series(agent)),
            Rule(r"^min_over_time\(timestamp\(ALERTS", vector((alert, 1000.0))),
            Rule(r"^max_over_time\(timestamp\(ALERTS", vector((alert, 2000.0))),
        ]
    )
    with serving(fake):
        code, out, err = run(capsys, "--node", "n07", "--prometheus", fake.url, "--at", "5000")
        assert (code, err) == (0, "")
        lines = out.splitlines()
        jobs = lines.index("Jobs it hurt (1)")
        assert lines[jobs + 1 : jobs + 3] == [
            "  7\\x1b]0;owned\\x07 1970-01-01 00:16:40 to 1970-01-01 00:33:20 UTC",
            "               lockstep report 7\\x1b]0;owned\\x07: LockstepTrainingStraggler",
        ]
        assert "\x1b" not in out
        code, out, _ = run(capsys, "--node", "n07", "--prometheus", fake.url, "--at", "5000", "--format", "json")
    assert json.loads(out)["jobs"][0]["job_id"] == "7\x1b]0;owned\x07"  # the data as it is; only the text escapes it
    # Every query names the node's agents and its cluster, and reads the window before --at.
    assert all('instance=~"n07:12400"' in q and 'cluster="a"' in q for q in fake.seen if not q.startswith("series"))
