"""The agent under its open-file limit (issue 29 item 1): a training-log directory with more
files than the process may open never takes the descriptors the endpoint needs, the excess is
counted, and everything comes back by itself once the files are gone; and when the process is
out of descriptors for whatever reason, the endpoint still answers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import REPO, AgentProcess, free_port, http_get, samples, wait_until
from tests.support.training_logs import log_steps

# Tier: real processes and tools (tests/conftest.py).
pytestmark = pytest.mark.real

OPEN_FILES = 256  # the agent's RLIMIT_NOFILE here (the unit's LimitNOFILE=8192, scaled down)
FILES_CAP = OPEN_FILES // 4  # the training collector's share (collectors/toolkit/follow.py)
LOG_FILES = 300  # more than the whole limit, as the 8,400 were above 8,192


def _open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _open_files_under(pid: int, directory: Path) -> int:
    """The process's descriptors open on files in ``directory`` (exact, unlike a difference of
    totals, which a scrape's socket opening or closing in between moves by one)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed since the listing
        count += Path(target).parent == directory
    return count


def _training(text: str) -> dict[str, float]:
    s = samples(text)
    steps = [v for (name, _), v in s.items() if name == "lockstep_training_steps_total"]
    return {
        "files": s[("lockstep_training_log_files", frozenset())],
        "skipped": s.get(("lockstep_training_skipped_log_files", frozenset()), -1),  # -1: not reported
        "ranks": len(steps),
        "steps": sum(steps),
        "up": s[("lockstep_collector_up", frozenset({("collector", "training")}))],
    }


def test_more_log_files_than_the_open_file_limit_cost_the_endpoint_nothing(tmp_path: Path) -> None:
    """300 rank logs appear in a watched directory of an agent limited to 256 descriptors.  The
    issue's agent opened every file an inotify event named, past its 1,024 cap, until accept()
    failed with EMFILE: /metrics and /healthz went silent for good, even after the files were
    deleted.  Now at most 64 (a quarter of the limit) are open, the other 236 are counted,
    the endpoint answers throughout, and deleting the files frees their descriptors."""
    logs = tmp_path / "logs"
    logs.mkdir()
    config = tmp_path / "config.yml"
    config.write_text("collectors:\n  training:\n    interval: 500ms\n")
    args = ["run", "--config", str(config), "--collector.disable-defaults", "--collector.training"]
    args += ["--training.logs", str(logs / "*.jsonl"), "--training.start-at", "beginning"]
    with AgentProcess(*args, open_files=OPEN_FILES) as agent:
        assert agent.proc is not None
        pid = agent.proc.pid
        wait_until(lambda: _training(agent.metrics())["up"] == 1, timeout=20, what="the training collector up")
        baseline = _open_descriptors(pid)
        for rank in range(LOG_FILES):
            # Each file appears with its content in one event: its two steps are read at once.
            (logs / f".rank-{rank:03d}.tmp").write_text(log_steps(0, 2, job="5", rank=rank))
            os.rename(logs / f".rank-{rank:03d}.tmp", logs / f"rank-{rank:03d}.jsonl")
        held = wait_until(
            lambda: (t := _training(agent.metrics()))["skipped"] == LOG_FILES - FILES_CAP and t,
            timeout=30,
            what="the files over the cap counted",
        )
        assert held == {"files": FILES_CAP, "skipped": LOG_FILES - FILES_CAP, "ranks": 64, "steps": 128, "up": 1}
        assert http_get(agent.url + "/healthz")[0] == 200
        assert _open_files_under(pid, logs) == FILES_CAP
        assert _open_descriptors(pid) - baseline <= FILES_CAP + 8  # + the scrape's, inotify's

        for path in logs.iterdir():
            path.unlink()
        gone = wait_until(
            lambda: (t := _training(agent.metrics()))["files"] == 0 and t, timeout=30, what="the files closed"
        )
        assert (gone["skipped"], gone["up"]) == (0, 1)
        assert _open_files_under(pid, logs) == 0
        assert _open_descriptors(pid) - baseline <= 8

        (logs / "rank-900.jsonl").write_text(log_steps(0, 2, job="5", rank=900))  # and new files are followed again
        back = wait_until(lambda: (t := _training(agent.metrics()))["files"] == 1 and t, timeout=30, what="a new file")
        assert back["skipped"] == 0
        returncode, stderr = agent.stop()
    assert returncode == 0
    assert "Too many open files" not in stderr


def test_the_endpoint_answers_with_every_descriptor_taken(tmp_path: Path) -> None:
    """An HTTP server in a process that then opens files until EMFILE (whatever takes them: the
    issue's case was log files): the descriptor held in reserve accepts the connection, so
    /healthz and /metrics still answer 200, and after the files are closed, still again."""
    port = free_port()
    script = textwrap.dedent(
        f"""
        import os, resource, sys, threading
        from lockstep.agent.exporter import SnapshotExporter
        from lockstep.agent.server import make_server
        from lockstep.agent.webconfig import WebConfig
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        server = make_server("127.0.0.1:{port}", SnapshotExporter(list), WebConfig(), lambda: [])
        threading.Thread(target=server.serve_forever, daemon=True).start()
        taken = []
        try:
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            print("exhausted", exc.errno, flush=True)
        sys.stdin.readline()  # the test scrapes now
        for fd in taken:
            os.close(fd)
        print("released", flush=True)
        sys.stdin.readline()
        server.shutdown()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "exhausted 24\n"  # EMFILE
        url = f"http://127.0.0.1:{port}"
        for path in ("/healthz", "/metrics", "/healthz"):  # one at a time: one reserve
            assert http_get(url + path, timeout=5)[0] == 200
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "released\n"
        assert http_get(url + "/metrics", timeout=5)[0] == 200
        proc.stdin.write("\n")
        proc.stdin.flush()
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if "cannot accept a connection" in line]
    assert len(warnings) == 1  # logged once a minute at most, not per connection
