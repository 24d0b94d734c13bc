"""`lockstep report` as the CLI runs it (in-process): one clear line and exit 1 for every way a
report cannot be made, the stored report read first, --refresh and --save."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from lockstep.agent.cli import main
from lockstep.report import store, text
from lockstep.report.model import from_json, to_json
from tests.support.fake_prometheus import FakePrometheus, serving
from tests.support.reports import sample_report


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_prometheus_unreachable_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    port = closed_port()
    code, out, err = run(capsys, "4242", "--prometheus", f"http://127.0.0.1:{port}", "--store", str(tmp_path))
    assert (code, out) == (1, "")
    assert (
        err == f"lockstep: report: cannot reach Prometheus at http://127.0.0.1:{port}: [Errno 111] Connection refused\n"
    )


@pytest.mark.parametrize("url", ["localhost:9090", "ftp://prom", "http://"])
def test_a_bad_url_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str) -> None:
    code, out, err = run(capsys, "4242", "--prometheus", url, "--store", str(tmp_path))
    assert (code, out, err) == (1, "", f"lockstep: report: --prometheus {url!r} is not an http:// or https:// URL\n")


def test_an_unknown_job_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with serving(FakePrometheus()) as fake:
        code, out, err = run(capsys, "4242", "--prometheus", fake.url, "--cluster", "a", "--store", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == f"lockstep: report: job 4242 in cluster a is unknown to Prometheus at {fake.url} (last 31 days)\n"


def test_not_a_prometheus_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with serving(FakePrometheus(raw=b"<html>Grafana</html>")) as fake:
        code, out, err = run(capsys, "4242", "--prometheus", fake.url, "--store", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == f"lockstep: report: {fake.url} is not a Prometheus query API (its answer is not JSON)\n"


def test_the_stored_report_is_read_first_without_asking_prometheus(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = sample_report()
    path = store.save(tmp_path, report)
    assert path == tmp_path / "h100-a" / "4242.json"
    assert path.read_text() == to_json(report, compact=True)
    dead = f"http://127.0.0.1:{closed_port()}"
    code, out, err = run(capsys, "4242", "--cluster", "h100-a", "--prometheus", dead, "--store", str(tmp_path))
    assert (code, out, err) == (0, text.render(report), "")
    code, out, _ = run(capsys, "4242", "--cluster", "h100-a", "--store", str(tmp_path), "--format", "json")
    assert (code, from_json(out)) == (0, report)
    # --refresh recomputes: Prometheus is asked, and here it is not there.
    code, out, err = run(
        capsys, "4242", "--cluster", "h100-a", "--prometheus", dead, "--store", str(tmp_path), "--refresh"
    )
    assert (code, out) == (1, "")
    assert err.startswith(f"lockstep: report: cannot reach Prometheus at {dead}")


def test_without_a_cluster_the_stored_report_is_found_in_its_clusters_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The epilog stores under the cluster Prometheus named; `lockstep report JOB` finds it there."""
    report = sample_report()
    store.save(tmp_path, report)
    dead = f"http://127.0.0.1:{closed_port()}"
    code, out, err = run(capsys, "4242", "--prometheus", dead, "--store", str(tmp_path))
    assert (code, out, err) == (0, text.render(report), "")
    # The same job id stored in two clusters: which one is asked for, as Prometheus' would be.
    report.job.cluster = "a100-b"
    store.save(tmp_path, report)
    code, out, err = run(capsys, "4242", "--prometheus", dead, "--store", str(tmp_path))
    assert (code, out) == (1, "")
    assert (
        err == "lockstep: report: job 4242 has reports stored for clusters a100-b, h100-a: choose one with --cluster\n"
    )
    code, out, err = run(capsys, "4242", "--cluster", "a100-b", "--prometheus", dead, "--store", str(tmp_path))
    assert (code, out, err) == (0, text.render(report), "")
    # --refresh recomputes whatever is stored.
    code, out, err = run(capsys, "4242", "--prometheus", dead, "--store", str(tmp_path), "--refresh")
    assert (code, out) == (1, "")
    assert err.startswith(f"lockstep: report: cannot reach Prometheus at {dead}")


def test_a_damaged_stored_report_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "_").mkdir()
    (tmp_path / "_" / "4242.json").write_text(json.dumps({"schema": "other"}))
    code, out, err = run(capsys, "4242", "--store", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == (
        f"lockstep: report: stored report unreadable: {tmp_path}/_/4242.json: "
        "not a lockstep.report/v1 report (schema: 'other')\n"
    )


def test_the_output_file_gets_the_chosen_format(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store.save(tmp_path, sample_report())
    out_file = tmp_path / "r.html"
    code, out, err = run(
        capsys, "4242", "--cluster", "h100-a", "--store", str(tmp_path), "--format", "html", "--output", str(out_file)
    )
    assert (code, out, err) == (0, "", "")
    assert out_file.read_text().startswith('<!DOCTYPE html>\n<html lang="en">')
    code, _, err = run(capsys, "4242", "--cluster", "h100-a", "--store", str(tmp_path), "--output", str(tmp_path))
    assert code == 1
    assert err == f"lockstep: report: cannot write {tmp_path}: Is a directory\n"


def test_a_store_path_safe_for_any_job_id() -> None:
    assert store.path_of(Path("/s"), "../../etc/x", "a/b") == Path("/s/a_b/.._.._etc_x.json")
    assert store.path_of(Path("/s"), "4242_1", None) == Path("/s/_/4242_1.json")
