"""Hostile input, round two (issue 29): the full-size attacks against a real agent, with its RSS,
open descriptors, series and scrape latency before, during and after each.

    .venv/bin/python bench/hostile_input.py [CASE ...]      every case when none is named
    .venv/bin/python bench/hostile_input.py --list

Each case starts `lockstep run` as its own process (so the figures are the agent's alone) with
the collectors the attack needs, running every 2 s, measures it idle ("before"), makes the
hostile input an unprivileged user on the node could make, measures it while the input is there
("during"), removes the input and measures again ("after").  A scrape is timed 5 times per
phase (p50 and max).  The hostile-input tests in tests/collectors/<collector>/,
tests/agent/test_fd_limit.py and tests/agent/test_samples.py run the same attacks scaled
down, with exact assertions; this prints figures only (the machines are shared and noisy: the
load average is printed beside them).

The discovery cases (items 6 and 7) give the agent a procfs view of the case's processes only
(tests/support/lookalikes.py: symlinks to /proc/PID), so other processes on the machine that look
like engines do not change the figures; everything else is real (processes, sockets, HTTP).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import free_port  # noqa: E402
from tests.support.lookalikes import LookalikeEngines, procfs_view  # noqa: E402

INTERVAL = "2s"


class Agent:
    """`lockstep run` as a child process, with LimitNOFILE-like open-file limit."""

    def __init__(
        self,
        workdir: Path,
        collectors: dict[str, dict[str, str]],
        open_files: int = 8192,
        procfs: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "agent.yml"
        sections = "".join(
            f"  {name}:\n    interval: {INTERVAL}\n" + "".join(f"    {k}: {v}\n" for k, v in options.items())
            for name, options in collectors.items()
        )
        config.write_text(f"log_level: warning\ncollectors:\n{sections}")
        args = ["run", "--config", str(config), "--collector.disable-defaults", "--listen", f"127.0.0.1:{self.port}"]
        args += [f"--collector.{name}" for name in collectors]
        if procfs is not None:
            args += ["--path.procfs", str(procfs)]

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.log = open(workdir / "agent.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lockstep.agent.cli", *args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            preexec_fn=limit,
        )
        deadline = time.monotonic() + 60
        while not self._answers("/healthz"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not start: {(workdir / 'agent.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def _answers(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def scrape(self) -> tuple[float, str]:
        """(seconds, page); (inf, '') when the scrape fails."""
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
                page = response.read().decode()
        except OSError:
            return float("inf"), ""
        return time.monotonic() - started, page

    def value(self, page: str, name: str, **labels: str) -> float | None:
        for line in page.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
                if all(found.get(k) == v for k, v in labels.items()):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def phase(self, case: str, phase: str, extra: Callable[[str], dict[str, object]]) -> str:
        """Measure and print one line; returns the last page."""
        latencies, page = [], ""
        for _ in range(5):
            seconds, text = self.scrape()
            latencies.append(seconds)
            page = text or page
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) * 1024  # type: ignore[union-attr]
        fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        series = sum(1 for line in page.splitlines() if line and not line.startswith("#"))
        health = "ok" if self._answers("/healthz") else "FAILED"
        failed = sum(1 for s in latencies if s == float("inf"))
        figures = {
            "rss_mb": round(rss / 1e6, 1),
            "fds": fds,
            "series": series,
            "page_kb": round(len(page) / 1e3, 1),
            "scrape_p50_ms": round(statistics.median(latencies) * 1000, 1) if failed < 3 else None,
            "scrape_max_ms": round(max(latencies) * 1000, 1) if not failed else None,
            "failed_scrapes": failed,
            "healthz": health,
            **extra(page),
        }
        print(f"{case:22} {phase:7} {json.dumps(figures)}  (load {os.getloadavg()[0]:.1f})", flush=True)
        return page

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def wait_rounds(rounds: int = 3) -> None:
    time.sleep(rounds * float(INTERVAL.rstrip("s")))


def _collector(agent: Agent, page: str, name: str) -> dict[str, object]:
    duration = agent.value(page, "lockstep_collector_duration_seconds", collector=name)
    return {
        f"{name}_up": agent.value(page, "lockstep_collector_up", collector=name),
        f"{name}_last_run_ms": None if duration is None else round(duration * 1000, 1),
    }


def _record(job: str, rank: int, host: str, step: int, metric: str, value: float) -> str:
    fields = {"ts": time.time() - 30, "job_id": job, "rank": rank, "host": host, "step": step}
    return json.dumps({**fields, "metric": metric, "value": value}) + "\n"


def _count(page: str, prefix: str) -> int:
    return sum(1 for line in page.splitlines() if line.startswith(prefix))


def _log_lines(workdir: Path) -> int:
    return len((workdir / "agent.log").read_text().splitlines())


def _remove_deep(top: Path) -> None:
    """Remove a chain of nested ``d`` directories without recursion (shutil.rmtree recurses)."""
    path = top
    while (path / "d").is_dir():
        path = path / "d"
    while path != top.parent:
        path.rmdir()
        path = path.parent


# --- the cases -------------------------------------------------------------------------------


def fd_exhaustion(workdir: Path) -> None:
    """Item 1: 8,400 new JSON-lines files in a watched training-log directory, LimitNOFILE=8192."""
    logs = workdir / "logs"
    logs.mkdir()
    agent = Agent(workdir, {"training": {"logs": f"['{logs}/*.jsonl']", "start_at": "beginning"}}, open_files=8192)

    def extra(page: str) -> dict[str, object]:
        return {
            "log_files": agent.value(page, "lockstep_training_log_files"),
            "skipped_log_files": agent.value(page, "lockstep_training_skipped_log_files"),
            **_collector(agent, page, "training"),
        }

    try:
        agent.phase("fd_exhaustion", "before", extra)
        for rank in range(8400):
            (logs / f"rank-{rank:05d}.jsonl").write_text(_record("1", rank, "h", 0, "step_time_sec", 1.0))
        wait_rounds(3)
        agent.phase("fd_exhaustion", "during", extra)
        for path in logs.iterdir():
            path.unlink()
        wait_rounds(4)  # deleted files are closed after two quiet sweeps
        agent.phase("fd_exhaustion", "after", extra)
    finally:
        agent.stop()


def one_byte_lines(workdir: Path) -> None:
    """Item 2: one 16 MiB log of `1` lines."""
    logs = workdir / "logs"
    logs.mkdir()
    agent = Agent(workdir, {"training": {"logs": f"['{logs}/*.jsonl']", "start_at": "beginning"}})

    def extra(page: str) -> dict[str, object]:
        return {
            "not_json_lines": agent.value(page, "lockstep_training_log_lines_invalid_total", reason="not_json"),
            **_collector(agent, page, "training"),
        }

    try:
        agent.phase("one_byte_lines", "before", extra)
        (logs / "rank-0.jsonl").write_bytes(b"1\n" * (8 * 1024 * 1024))
        wait_rounds(3)
        agent.phase("one_byte_lines", "during", extra)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until every line is read (MAX_LINES a round)
            page = agent.scrape()[1]
            if agent.value(page, "lockstep_training_log_lines_invalid_total", reason="not_json") == 8 * 1024 * 1024:
                break
            time.sleep(1)
        agent.phase("one_byte_lines", "drained", extra)
        (logs / "rank-0.jsonl").unlink()
        wait_rounds(4)
        agent.phase("one_byte_lines", "after", extra)
    finally:
        agent.stop()


def many_ranks(workdir: Path) -> None:
    """Item 3: one log with 150,000 distinct job/rank/host values."""
    logs = workdir / "logs"
    logs.mkdir()
    options = {"logs": f"['{logs}/*.jsonl']", "start_at": "beginning", "idle_timeout": "30s"}
    agent = Agent(workdir, {"training": options})

    def extra(page: str) -> dict[str, object]:
        ranks = sum(1 for line in page.splitlines() if line.startswith("lockstep_training_steps_total{"))
        refused = agent.value(page, "lockstep_training_log_lines_invalid_total", reason="too_many_ranks")
        return {"ranks_held": ranks, "records_refused": refused, **_collector(agent, page, "training")}

    try:
        agent.phase("many_ranks", "before", extra)
        with open(logs / "ranks.jsonl", "w") as f:
            for i in range(150_000):
                f.write(_record(f"j{i % 1000}", i // 1000, f"host{i}", 0, "step_time_sec", 1.0))
        wait_rounds(4)
        agent.phase("many_ranks", "during", extra)
        (logs / "ranks.jsonl").unlink()
        wait_rounds(18)  # idle_timeout 30 s: the ranks held are dropped
        agent.phase("many_ranks", "after", extra)
    finally:
        agent.stop()


def deep_checkpoint_dir(workdir: Path) -> None:
    """Item 5: a directory 1,000 levels deep under a checkpoint root watched with inotify."""
    ckpt = workdir / "ckpt"
    good = ckpt / "good" / "step_1"
    good.mkdir(parents=True)
    (good / "__0_0.distcp").write_bytes(b"x" * 1000)
    (good / ".metadata").write_bytes(b"m")
    (ckpt / "deep").mkdir()  # the root whose tree grows 1,000 levels deep
    agent = Agent(workdir, {"checkpoint": {"roots": f"[{{path: '{ckpt}/*', watch: inotify}}]"}})

    def extra(page: str) -> dict[str, object]:
        return {
            "good_last_size_bytes": agent.value(page, "lockstep_checkpoint_last_size_bytes", root=f"{ckpt}/good"),
            "skipped_directories": agent.value(page, "lockstep_checkpoint_skipped_directories", root=f"{ckpt}/deep"),
            **_collector(agent, page, "checkpoint"),
        }

    deep = ckpt / "deep" / "tree"
    try:
        agent.phase("deep_checkpoint_dir", "before", extra)
        path = deep
        path.mkdir()
        for _ in range(1000):
            path = path / "d"
            path.mkdir()
        wait_rounds(3)
        agent.phase("deep_checkpoint_dir", "during", extra)
        _remove_deep(deep)
        wait_rounds(3)
        agent.phase("deep_checkpoint_dir", "after", extra)
    finally:
        if deep.exists():
            _remove_deep(deep)
        agent.stop()


def _with_lookalikes(
    agent: Agent,
    case: str,
    extra: Callable[[str], dict[str, object]],
    view: Path,
    where: Path,
    count: int,
    mode: str,
    first_port: int,
) -> None:
    """The discovery cases' phases: measured before, while ``count`` look-alikes run (added to
    the agent's procfs view) and after they are stopped."""
    wait_rounds(2)
    agent.phase(case, "before", extra)
    lookalikes = LookalikeEngines(where, count, mode, first_port=first_port)
    try:
        procfs_view(view, lookalikes.pids)
        wait_rounds(8)  # 32 engines are found in 4 rounds of 8 probes
        agent.phase(case, "during", extra)
    finally:
        lookalikes.stop()
    wait_rounds(4)
    agent.phase(case, "after", extra)


def lookalike_engines(workdir: Path) -> None:
    """Item 6: 400 answering look-alike engines (`python3 .../vllm serve`, one port each) forked by one process."""
    view = procfs_view(workdir / "proc", [])
    agent = Agent(workdir, {"inference": {}}, procfs=view)

    def extra(page: str) -> dict[str, object]:
        return {
            "process_info": _count(page, "lockstep_inference_process_info{"),
            "up_series": _count(page, "lockstep_inference_up{"),
            "over_cap": agent.value(page, "lockstep_inference_discovered_processes", category="over_cap"),
            "log_lines": _log_lines(workdir),
            **_collector(agent, page, "inference"),
        }

    try:
        _with_lookalikes(agent, "lookalike_engines", extra, view, workdir / "lookalikes", 400, "answer", 20000)
    finally:
        agent.stop()


def silent_lookalikes(workdir: Path) -> None:
    """Item 7: a real engine found, then 40 silent look-alikes on lower ports."""
    real = LookalikeEngines(workdir / "real", 1, "answer", first_port=47000)
    view = procfs_view(workdir / "proc", real.pids)
    agent = Agent(workdir, {"inference": {}}, procfs=view)
    labels = {"engine": "vllm", "model": "llama", "server": real.urls()[0]}

    def extra(page: str) -> dict[str, object]:
        return {
            "real_up": agent.value(page, "lockstep_inference_up", **labels),
            "real_running": agent.value(page, "lockstep_inference_requests_running", **labels),
            "probing": agent.value(page, "lockstep_inference_discovered_processes", category="probing"),
            "log_lines": _log_lines(workdir),
            **_collector(agent, page, "inference"),
        }

    try:
        _with_lookalikes(agent, "silent_lookalikes", extra, view, workdir / "silent", 40, "silent", 30000)
    finally:
        agent.stop()
        real.stop()


CASES: dict[str, Callable[[Path], None]] = {
    "fd_exhaustion": fd_exhaustion,
    "one_byte_lines": one_byte_lines,
    "many_ranks": many_ranks,
    "deep_checkpoint_dir": deep_checkpoint_dir,
    "lookalike_engines": lookalike_engines,
    "silent_lookalikes": silent_lookalikes,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"one of {', '.join(CASES)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    if args.list:
        for name, case in CASES.items():
            print(f"{name:22} {(case.__doc__ or '').strip()}")
        return 0
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r} (known: {', '.join(CASES)})")
    for name in args.cases or list(CASES):
        with tempfile.TemporaryDirectory(prefix=f"lockstep-bench-{name}-") as tmp:
            CASES[name](Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
