"""`lockstep report` against a Prometheus that misbehaves (issue 46), on real loopback sockets
(tests/support/hostile_prometheus.py): whatever the server does, the report finishes or fails
within its deadline, reads no answer above its cap, fails in one line on stderr and exit status
1, writes nothing outside its store, and its text carries no control character a terminal acts
on.  The earlier cases (a server that is not Prometheus, an unknown job, a bad URL) are in
test_report_command.py."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from lockstep.agent.cli import main
from lockstep.report import store, text
from lockstep.report.model import Alert
from lockstep.report.prometheus import ReportError
from tests.support import LOCKSTEP
from tests.support.fake_prometheus import FakePrometheus, Rule, matrix, series, serving, vector
from tests.support.hostile_prometheus import HostileServer, Reply, beside, success
from tests.support.reports import sample_report

T = 1_800_000_000.0
COARSE = r"\[5356800ms\]\)\)$"  # find_job's buckets, their parts, the parts' windows
PARTS = r"\[107136ms\]\)\)$"
FINE = r"\[10714ms\]\)\)$"
# The queries of the sections that run beside the steps' (build.make_report's threads).
ALONGSIDE = r"^(max_over_time\(ALERTS|lockstep_ib_|rate\(lockstep_nccl_|avg_over_time\(job_comm_rank)"
RANKS = 'max(max_over_time(lockstep_nccl_communicator_ranks{job_id="77",cluster="a"}[50000ms]))'


def job_rules(**labels: str) -> list[Rule]:
    """Job 77 as Prometheus knows it: Slurm's record on one agent, from T - 25 to T - 5."""
    job = {"__name__": "lockstep_slurm_job_info", "cluster": "a", "instance": "n1:12400", **labels}
    return [
        Rule(r"^series ", series(job)),
        Rule(r"^count\(count_over_time\(.*" + COARSE, matrix(({}, [(T, 3.0)])), when=lambda times: "step" in times),
        Rule(r"^count\(count_over_time\(.*" + PARTS, matrix(({}, [(T - 30, 1.0), (T, 2.0)]))),
        Rule(r"^count\(count_over_time\(.*" + FINE, matrix(({}, [(T - 20, 1.0), (T, 2.0)]))),
        Rule(r"^min\(min_over_time\(\(timestamp", vector(({}, T - 25))),
        Rule(r"^max\(max_over_time\(\(timestamp", vector(({}, T - 5))),
        Rule(r"^last_over_time\(lockstep_slurm_job_info", vector((job, 1.0))),
    ]


def report_args(url: str, tmp_path: Path, *more: str) -> list[str]:
    return ["report", "77", "--prometheus", url, "--at", str(T), "--store", str(tmp_path / "store"), *more]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    assert err.startswith("lockstep: report: ") and err.endswith("\n") and err.count("\n") == 1, err
    return err


def test_the_job_rules_make_a_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """(The stand-in the cases below start from: a report is made, its sections asked side by side.)"""
    with serving(FakePrometheus(job_rules())) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, err) == (0, "")
    assert out.startswith("Lockstep report: job 77 (cluster a)\n")
    assert [q for q in fake.seen if q.startswith("max_over_time(ALERTS")]


# --- 1. one deadline for the whole report ---


def dripping(endpoint: str, query: str) -> Reply | None:
    """The sections' answers beside the steps', a byte every 0.2 s: each read of the socket is
    answered well within any per-read timeout."""
    if re.search(ALONGSIDE, query):
        return Reply(success(endpoint, []), drip=0.2)
    return None


def test_a_server_that_drips_its_answers_fails_the_report_at_its_deadline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Headers, then a byte every 0.2 s, to the queries the report's threads ask side by side:
    the report fails at its deadline (2 s here), in one line, and its threads have ended.
    Before, each read's 30-s timeout never passed, and the report went on for ever."""
    with HostileServer(beside(FakePrometheus(job_rules()), dripping)) as server:
        started = time.monotonic()
        code, out, err = run(capsys, *report_args(server.url, tmp_path, "--timeout", "2"))
        took = time.monotonic() - started
    assert (code, out) == (1, "")
    assert one_line(err) == (
        f"lockstep: report: Prometheus at {server.url} did not answer within the report's 2-s deadline (--timeout)\n"
    )
    assert took < 3 * 2
    assert [t.name for t in threading.enumerate() if t.name.startswith("report")] == []
    assert any(re.search(ALONGSIDE, form.get("query", "")) for _, form in server.requests)  # (dripped)


@pytest.mark.real
def test_the_report_process_ends_at_its_deadline_when_every_answer_drips(tmp_path: Path) -> None:
    """The command as the epilog runs it (--save), its process: it exits 1 at its deadline (no
    thread of it left waiting), the first answer dripped as every later one would be."""
    with HostileServer(lambda endpoint, form: Reply(success(endpoint, []), drip=0.5)) as server:
        started = time.monotonic()
        done = subprocess.run(
            [*LOCKSTEP, *report_args(server.url, tmp_path, "--save", "--timeout", "5")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"lockstep: report: Prometheus at {server.url} did not answer within the report's 5-s deadline (--timeout)\n"
    )
    assert took < 3 * 5  # (the interpreter's start included)
    assert not (tmp_path / "store").exists()


# --- 2. every answer bounded ---


def test_an_answer_above_the_cap_is_refused_by_its_length_unread(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A valid 100 MiB answer to the series query (before: past 2 GB of memory in 26 s)."""
    item = b'{"__name__":"lockstep_slurm_job_info","cluster":"a","job_id":"77"},'
    body = b'{"status":"success","data":[' + item * (100 * 2**20 // len(item)) + b"{}]}"
    with HostileServer(lambda endpoint, form: Reply(body)) as server:
        code, out, err = run(capsys, *report_args(server.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"lockstep: report: Prometheus at {server.url} answered series {{__name__=~")
    assert err.endswith("... with more than 64 MiB (--max-answer): refused\n")


def test_an_answer_without_a_length_is_read_no_further_than_the_cap(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """3 MiB with no Content-Length (the body ends when the server closes), against a 1-MiB cap."""
    body = json.dumps({"status": "success", "data": [{"job_id": "77", "pad": "x" * 1000}] * 3000}).encode()
    with HostileServer(lambda endpoint, form: Reply(body, length=-1)) as server:
        code, out, err = run(capsys, *report_args(server.url, tmp_path, "--max-answer", "1"))
    assert (code, out) == (1, "")
    assert one_line(err).endswith("... with more than 1 MiB (--max-answer): refused\n")


# --- 3. text carries no control character a terminal acts on ---


def test_text_output_writes_control_characters_visibly() -> None:
    """The job's name (its user's choice) and every other label shown: ESC ] 0 ; ... BEL
    (retitles the terminal), ESC [ 2 J (clears it), C1's CSI, DEL, a newline: each escaped."""
    report = sample_report()
    job = report.job
    job.job_name = "\x1b]0;you are root\x07train\x1b[2J"
    job.user, job.partition, job.account = "al\x1bice", "h1\x9b00", "llm\x7f"
    job.hosts = ["n12\x1b[31m", "n25\nfake line"]
    report.gpus[0].node = "n\x1b[2J12"
    report.alerts.append(Alert("Evil\x1b[5m", "warning", job.start, job.end, {"rank": "3\x07"}))
    out = text.render(report)
    lines = out.splitlines()
    assert "  name   \\x1b]0;you are root\\x07train\\x1b[2J user al\\x1bice" in lines
    assert "  where  partition h1\\x9b00, account llm\\x7f" in lines
    assert "  nodes  n12\\x1b[31m, n25\\x0afake line" in lines
    assert any(line.startswith("  n\\x1b[2J12     5   97%") for line in lines)
    assert any(line.startswith("  - Evil\\x1b[5m (warning) ") and line.endswith(": rank=3\\x07") for line in lines)
    assert [c for c in out if unicodedata.category(c) == "Cc" and c != "\n"] == []
    assert all(len(line) <= text.WIDTH for line in lines)
    # The report itself is left as it was (its JSON and HTML write these strings their own way).
    assert job.job_name == "\x1b]0;you are root\x07train\x1b[2J"


def test_text_output_from_prometheus_labels_is_escaped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with serving(FakePrometheus(job_rules(job_name="x\x1b]0;t\x07y", user="\x1b[2J"))) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, err) == (0, "")
    assert "  name   x\\x1b]0;t\\x07y user \\x1b[2J\n" in out
    assert "\x1b" not in out and "\x07" not in out


def test_an_error_line_shows_control_characters_visibly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Names from Prometheus' labels in an error (a job in two clusters) reach the terminal too."""
    rules = [Rule(r"^series ", series({"cluster": "b\x1b]0;x\x07"}, {"cluster": "a\nb"}))]
    with serving(FakePrometheus(rules)) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err) == (
        "lockstep: report: job 77 ran in clusters a\\x0ab, b\\x1b]0;x\\x07: choose one with --cluster\n"
    )


# --- 4. one line, never a traceback ---


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_a_sample_value_that_is_not_finite_is_one_line_naming_its_series(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    labels = {"cluster": "a", "job_id": "77"}
    rules = [Rule(r"^max\(max_over_time\(lockstep_nccl_communicator_ranks", [{"metric": labels, "value": [T, value]}])]
    with serving(FakePrometheus(rules + job_rules())) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err) == (
        f"lockstep: report: Prometheus at {fake.url} answered {RANKS} with the value {float(value)!r} for "
        'series {cluster="a",job_id="77"}: not a finite number, which the report cannot use\n'
    )


def test_a_non_finite_point_of_a_range_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = [Rule(r"^count\(count_over_time\(.*" + COARSE, [{"metric": {"x": "1"}, "values": [[T, "1"], [T, "NaN"]]}])]
    with serving(FakePrometheus(rules + job_rules())) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err).endswith(
        ' with the value nan for series {x="1"}: not a finite number, which the report cannot use\n'
    )


def test_json_nested_100000_deep_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with serving(FakePrometheus(raw=b"[" * 100_000 + b"]" * 100_000)) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"lockstep: report: Prometheus at {fake.url} answered series {{__name__=~")
    assert err.endswith("... with JSON nested too deep\n")


@pytest.mark.parametrize(
    ("result", "said"),
    [
        ([{"metric": {}}], "series {} without values"),
        ([{"values": [[T, "1"]]}], "a series without its labels"),
        ([{"metric": {"job_id": 77}, "values": []}], "a label job_id that is not a string"),
        ([{"metric": {}, "values": [[T]]}], "what is not its query API's answer (not enough values to unpack"),
        ([{"metric": {}, "values": [[T, "many"]]}], "what is not its query API's answer (could not convert"),
    ],
)
def test_a_matrix_not_of_the_apis_shape_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, result: Any, said: str
) -> None:
    rules = [Rule(r"^count\(count_over_time\(.*" + COARSE, result)]
    with serving(FakePrometheus(rules + job_rules())) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err).startswith(
        f"lockstep: report: Prometheus at {fake.url} answered "
        'count(count_over_time(lockstep_slurm_job_info{job_id="77",cluster="a"}[5356800ms])) with '
    )
    assert said in err


def test_an_answer_cut_short_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with HostileServer(lambda endpoint, form: Reply(b'{"status":"succ', length=1000)) as server:
        code, out, err = run(capsys, *report_args(server.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err).startswith(f"lockstep: report: Prometheus at {server.url} broke off its answer to series {{")
    assert err.endswith("... after 15 of its 1000 bytes\n")


def test_an_error_answer_shows_its_first_line_with_control_characters_visible(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with serving(FakePrometheus(raw=b'{"status":"error","error":"bad \\u001b[2J query\\nsecond line"}')) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path))
    assert (code, out) == (1, "")
    assert one_line(err) == f"lockstep: report: Prometheus at {fake.url} failed a query: bad \\x1b[2J query\n"


# --- 5. nothing written outside the store ---


def test_a_cluster_named_dot_dot_stores_nothing_outside_the_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A series labelled cluster="..", and --save (the epilog's command): before, STORE/../77.json."""
    rules = [Rule(r"^series ", series({"__name__": "lockstep_slurm_job_info", "cluster": "..", "instance": "n1"}))]
    with serving(FakePrometheus(rules + job_rules())) as fake:
        code, out, err = run(capsys, *report_args(fake.url, tmp_path, "--save"))
    assert (code, out) == (1, "")
    assert one_line(err) == "lockstep: report: cluster '..' cannot name a folder in the report store: refused\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


@pytest.mark.parametrize(
    ("job_id", "cluster"), [("77", ".."), ("77", "."), ("77", ".hidden"), ("", "a"), ("77", "../..")]
)
def test_a_store_path_never_leaves_the_store(job_id: str, cluster: str) -> None:
    with pytest.raises(ReportError, match=r"cannot name a (folder|file) in the report store: refused$"):
        store.path_of(Path("/s"), job_id, cluster)


@pytest.mark.parametrize(
    ("job_id", "cluster", "path"),
    [("4242", "a\0b", "/s/a_b/4242.json"), ("..", "a", "/s/a/...json"), ("/", "a/..", "/s/a_../_.json")],
)
def test_a_store_path_of_odd_names_is_inside_the_store(job_id: str, cluster: str, path: str) -> None:
    assert store.path_of(Path("/s"), job_id, cluster) == Path(path)
