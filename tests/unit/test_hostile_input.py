"""Hostile input (issue 16): no value, file, endpoint or edit can blank, hang, kill or bloat the agent.

Each reproduction of the issue is a test here: the bad input is rejected or skipped with a
clear message naming it, the scrape keeps answering with the other collectors' data, counters
stay finite, and the daemon survives with bounded memory.  Generated inputs (hypothesis) cover
the parsers with values nobody thought of.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from lockstep.agent import cli
from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, Paths
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.logs import setup_logging
from lockstep.agent.options import MAX_DURATION, MIN_DURATION, parse_duration
from lockstep.agent.samples import MAX_LABEL_VALUE_CHARS, checked_families
from lockstep.agent.scheduler import Snapshot, State, Worker, WorkerView
from lockstep.agent.seams import WALL_CLOCK, Seams
from lockstep.agent.yamlfile import MAX_FILE_BYTES, YamlFileError, load_yaml_text
from lockstep.collectors.checkpoint import CheckpointCollector, CheckpointOptions
from lockstep.collectors.checkpoint.config import parse_roots
from lockstep.collectors.inference import InferenceCollector, InferenceOptions
from lockstep.collectors.inference.targets import parse_targets
from lockstep.collectors.infiniband import InfinibandCollector, InfinibandOptions
from lockstep.collectors.slurm import SlurmCollector, SlurmOptions
from lockstep.collectors.toolkit.command import CommandOutputError, run_command
from lockstep.collectors.toolkit.follow import FileFollower
from lockstep.collectors.toolkit.procs import ListeningSocket, listening_sockets, socket_inodes
from lockstep.collectors.training import TrainingCollector, TrainingOptions
from tests.support import (
    FIXTURES,
    LOCKSTEP,
    REPO,
    AgentProcess,
    collected,
    context,
    free_port,
    http_get,
    samples,
    wait_until,
)

SYSFS = FIXTURES / "fabric" / "sys"
PROC = FIXTURES / "host" / "proc"
SLURM_FIXTURES = FIXTURES / "slurm"
MLX5_COUNTERS = Path("class/infiniband/mlx5_0/ports/1/counters")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def up(text: str, collector: str) -> float:
    return samples(text)[("lockstep_collector_up", frozenset({("collector", collector)}))]


# --- the exporter: one family that cannot be rendered never blanks the scrape ---


def _view(name: str, families: list[Metric]) -> WorkerView:
    return WorkerView(
        name=name,
        state=State.OK,
        reason="",
        duration_seconds=0.01,
        last_success_wall_time=1.0,
        errors_total=0,
        runs_total=1,
        cpu_seconds_total=0.0,
        snapshot=Snapshot(tuple(families), finished_at=time.monotonic()),
    )


def test_an_unrenderable_family_fails_its_collector_only(caplog: pytest.LogCaptureFixture) -> None:
    # Built past the worker's check (a snapshot made by hand): the exporter's own guard.
    bad = CounterMetricFamily("lockstep_bad", "Too large.", labels=["device"])
    bad.add_metric(["mlx5_0"], 10**400)  # float() of it raises OverflowError
    good = GaugeMetricFamily("lockstep_good", "Fine.")
    good.add_metric([], 7)
    views = [_view("fabric", [bad]), _view("host", [good])]
    exporter = SnapshotExporter(lambda: views)
    with caplog.at_level(logging.ERROR):
        for accept in ("", "application/openmetrics-text; version=1.0.0", "", ""):
            body, _ = exporter.render(accept)
    text = exporter.render()[0].decode()
    assert samples(text)[("lockstep_good", frozenset())] == 7
    assert "lockstep_bad" not in text
    assert up(text, "fabric") == 0 and up(text, "host") == 1
    assert samples(text)[("lockstep_collector_state", frozenset({("collector", "fabric"), ("state", "failed")}))] == 1
    errors = [r.getMessage() for r in caplog.records if r.name == "lockstep.collector.fabric"]
    # Once per change, not per scrape: both formats fail for the same reason.
    assert (
        errors[0]
        == "collector failed: metric lockstep_bad cannot be rendered: OverflowError: int too large to convert to float"
    )
    assert len(errors) == 1


# --- the worker's domain check, for every collector ---

TOY_COUNTER = MetricSpec("lockstep_toy_events_total", "counter", "Toy events.", ("source",))
TOY_GAUGE = MetricSpec("lockstep_toy_level", "gauge", "Toy level.", ("source", "note"))


class Liar(Collector):
    """Reports what it is told: values outside every domain among good ones."""

    name = "liar"
    metrics = (TOY_COUNTER, TOY_GAUGE)

    def collect(self) -> Iterator[Metric]:
        counter, gauge = TOY_COUNTER.family(), TOY_GAUGE.family()
        counter.add_metric(["good"], 5)
        counter.add_metric(["huge"], 10**400)
        counter.add_metric(["negative"], -100)
        counter.add_metric(["infinite"], 1e308 * 10)
        counter.add_metric(["good"], 6)  # a repeated series: the first is kept
        gauge.add_metric(["nan", ""], math.nan)
        gauge.add_metric(["big-label", "x" * (MAX_LABEL_VALUE_CHARS + 1)], 1)
        gauge.add_metric(["negative", ""], -3)  # a gauge may be negative
        return iter([counter, gauge])


def test_samples_outside_their_domain_are_left_out_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(Liar(context()), interval=0.1, deadline=1, staleness_intervals=3, log=logging.getLogger("t"))
    with caplog.at_level(logging.WARNING, logger="t"):
        worker.start()
        wait_until(lambda: worker.view().runs_total >= 3, what="three rounds")
        worker.stop()
        worker.join(5)
    view = worker.view()
    assert view.state == State.OK
    text = SnapshotExporter(lambda: [view]).render()[0].decode()
    s = samples(text)
    assert s[("lockstep_toy_events_total", frozenset({("source", "good")}))] == 5
    assert s[("lockstep_toy_level", frozenset({("source", "negative"), ("note", "")}))] == -3
    # A label over the cap is cut (with a hash of the whole), not a reason to lose the sample.
    cut = "x" * (MAX_LABEL_VALUE_CHARS - 26) + "...sha256:" + hashlib.sha256(b"x" * 4097).hexdigest()[:16]
    assert s[("lockstep_toy_level", frozenset({("source", "big-label"), ("note", cut)}))] == 1
    toy = {labels for name, labels in s if name.startswith("lockstep_toy")}
    assert len(toy) == 3
    assert view.rejected_samples_total == 5 * view.runs_total
    assert s[("lockstep_collector_rejected_samples_total", frozenset({("collector", "liar")}))] == 5 * view.runs_total
    assert s[("lockstep_collector_altered_label_values_total", frozenset({("collector", "liar")}))] == view.runs_total
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # once per change, not once per round
    assert warnings[1].startswith("made safe 1 label values: lockstep_toy_level{note=xxxx")
    assert warnings[1].endswith(": label note cut from 4097 characters to 4096")
    assert warnings[0].startswith(
        "left out 5 samples outside their domain: lockstep_toy_events_total{source=huge}: value "
        "100000000000000000000000000000000000000000000000000000000000... (401 chars) is too large for a 64-bit float; "
        "lockstep_toy_events_total{source=negative}: value -100 is negative (a counter never is); "
        "lockstep_toy_events_total{source=infinite}: value inf is not a finite number (and 2 more)"
    )


# --- InfiniBand sysfs: the first reproduction, and the smaller defects ---


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    shutil.copytree(SYSFS, tmp_path / "sys", symlinks=True)
    return tmp_path / "sys"


def test_a_400_digit_ib_counter_is_skipped_and_the_scrape_holds_everything_else(sysfs: Path) -> None:
    (sysfs / MLX5_COUNTERS / "port_xmit_data").write_text("9" * 400)
    (sysfs / MLX5_COUNTERS / "port_rcv_data").write_text(str(1 << 64))  # one past the 64-bit width
    args = ["run", "--collector.disable-defaults", "--collector.infiniband", "--collector.host"]
    with AgentProcess(*args, "--path.sysfs", str(sysfs), "--path.procfs", str(PROC)) as agent:
        text = wait_until(lambda: next((t for t in [agent.metrics()] if "lockstep_ib_port_state" in t), None))
        returncode, stderr = agent.stop()
    s = samples(text)
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    assert up(text, "infiniband") == 1 and up(text, "host") == 1
    assert ("lockstep_ib_port_transmitted_bytes_total", port) not in s
    assert ("lockstep_ib_port_received_bytes_total", port) not in s
    assert s[("lockstep_ib_port_transmit_wait_total", port)] == 28441
    assert s[("lockstep_ib_port_unparseable_values_total", port)] == 2
    assert ("lockstep_host_processes_blocked", frozenset()) in s
    assert returncode == 0
    reasons = [json.loads(line).get("reason", "") for line in stderr.splitlines()]
    assert "99999999999999999999" + "9999... is wider than a 64-bit counter" in reasons
    assert "18446744073709551616... is wider than a 64-bit counter" in reasons


@pytest.mark.parametrize("rate", ["nan Gb/sec", "inf Gb/sec (4X EDR)", "-100 Gb/sec"])
def test_a_rate_that_is_not_a_finite_number_is_skipped_and_counted(sysfs: Path, rate: str) -> None:
    (sysfs / "class/infiniband/mlx5_0/ports/1/rate").write_text(rate + "\n")
    values = collected(InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions())))
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    assert ("lockstep_ib_port_rate_bytes_per_second", port) not in values
    assert values[("lockstep_ib_port_unparseable_values_total", port)] == 1


def test_a_huge_fw_ver_is_not_made_a_label(sysfs: Path) -> None:
    fw_ver = sysfs / "class/infiniband/mlx5_0/fw_ver"
    fw_ver.unlink()  # a symlink into the shared fixture in the copy
    # 100 MiB long, 1 MiB of it on disk: the rest is a hole (reads as zeros), which the test
    # leaves behind in pytest's temporary directory at no cost.
    fw_ver.write_text("2" * (1024 * 1024))
    os.truncate(fw_ver, 100 * 1024 * 1024)
    values = collected(InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions())))
    infos = [labels for name, labels in values if name == "lockstep_ib_port_info" and ("device", "mlx5_0") in labels]
    assert infos and all(("firmware_version", "") in labels for labels in infos)


def test_a_port_directory_removed_and_restored_comes_back(sysfs: Path) -> None:
    collector = InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions()))
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    assert ("lockstep_ib_port_state", port) in collected(collector)
    ports = sysfs / "class/infiniband/mlx5_0/ports"
    shutil.move(ports / "1", sysfs / "saved-port")
    assert ("lockstep_ib_port_state", port) not in collected(collector)
    assert ("lockstep_ib_port_state", port) not in collected(collector)
    shutil.move(sysfs / "saved-port", ports / "1")
    assert ("lockstep_ib_port_state", port) in collected(collector)


# --- the config file: bounded, never blocking, never fatal ---

ALIAS_BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
    "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
    "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
    "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
    "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n"
    "listen: *i\n"
)

# (how the file is made bad, what `config check` and the reload say about it)
BAD_CONFIGS = {
    "control character in a comment": (
        "collectors:\n  host:\n    interval: 1s  # a \x07 bell\n",
        "{f}:3:23: not valid YAML: control character '\\x07' is not allowed",
    ),
    "alias bomb": (ALIAS_BOMB, "{f}: holds more than 10000 values once its aliases are expanded"),
    "5000-deep nesting": (
        "collectors: " + "[" * 5000 + "]" * 5000 + "\n",
        "{f}:1:76: not valid YAML: nested more than 64 levels deep",
    ),
    "infinite interval": (
        "collectors:\n  host:\n    interval: .inf\n",
        "{f}:3: collectors.host.interval: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "nan deadline": (
        "collectors:\n  host:\n    deadline: .nan\n",
        "{f}:3: collectors.host.deadline: expected a finite duration such as 15s, 500ms or 2m, got nan",
    ),
    "tiny interval": (
        "collectors:\n  host:\n    interval: 0.0000001\n",
        "{f}:3: collectors.host.interval: must be at least 100ms, got 1e-07",
    ),
    "huge interval": (
        "collectors:\n  host:\n    interval: 1.0e+300\n",
        "{f}:3: collectors.host.interval: must be at most 604800s (7 days), got 1e+300",
    ),
    "infinite stat_timeout": (
        "collectors:\n  filesystem:\n    stat_timeout: .inf\n",
        "{f}:3: collectors.filesystem.stat_timeout: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "infinite inference timeout": (
        "collectors:\n  inference:\n    timeout: .inf\n",
        "{f}:3: collectors.inference.timeout: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "infinite controller_timeout": (
        "collectors:\n  slurm:\n    controller_timeout: .inf\n",
        "{f}:3: collectors.slurm.controller_timeout: expected a finite duration such as 15s, 500ms or 2m, got inf",
    ),
    "400-digit staleness": (
        f"staleness_intervals: {'9' * 400}\n",
        "{f}:1: staleness_intervals: expected a whole number of at most 1000000, got a 400-digit number",
    ),
    "too large": ("# " + "x" * MAX_FILE_BYTES + "\n", "{f}: cannot read: holds more than 131072 bytes"),
    "not UTF-8": ("listen: ':1'\n# \xff\n", None),
}


def _write_bad(path: Path, content: str) -> None:
    path.write_bytes(content.encode("utf-8") if "\xff" not in content else content.encode("latin-1"))


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_config_check_rejects_with_file_and_line(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lockstep.yml"
    content, message = BAD_CONFIGS[case]
    _write_bad(path, content)
    assert cli.main(["config", "check", str(path)]) == 2
    expected = message.format(f=path) if message else f"{path}:2: not valid UTF-8 (byte 0xff)"
    assert capsys.readouterr().err == f"lockstep: {expected}\n"


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_config_check_refuses_a_fifo_or_device_at_once(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lockstep.yml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    started = time.monotonic()
    assert cli.main(["config", "check", str(path)]) == 2
    assert time.monotonic() - started < 2
    what = "a FIFO" if kind == "fifo" else "a device"
    assert capsys.readouterr().err == f"lockstep: {path}: cannot read: is {what}, not a regular file\n"


def test_no_config_edit_takes_the_running_daemon_down(tmp_path: Path) -> None:
    """Every bad edit through the file watcher (no SIGHUP): each rejected by name, the running
    config kept, memory bounded, and SIGTERM still answered at once."""
    config = tmp_path / "lockstep.yml"
    config.write_text("collectors:\n  host:\n    interval: 200ms\n")
    log = tmp_path / "agent.log"
    cases = ("control character in a comment", "alias bomb", "5000-deep nesting", "infinite interval", "too large")
    runs = ("lockstep_collector_runs_total", frozenset({("collector", "host")}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["run", "--config", str(config), "--path.procfs", str(PROC), "--collector.disable-defaults"]
    with open(log, "w") as stderr:
        agent = subprocess.Popen(
            [*LOCKSTEP, *args, "--collector.host", "--listen", f"127.0.0.1:{port}"], stderr=stderr, cwd=REPO
        )
    try:

        def rejections() -> list[str]:
            entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
            prefix = "new configuration rejected, keeping the running one: "
            return [e["msg"].removeprefix(prefix) for e in entries if e["msg"].startswith(prefix)]

        def metrics() -> str:
            return http_get(url + "/metrics")[1]

        wait_until(lambda: _answers(url) and up(metrics(), "host") == 1, timeout=60, what="host up")
        for count, case in enumerate(cases, start=1):
            _write_bad(config, BAD_CONFIGS[case][0])
            wait_until(lambda n=count: len(rejections()) >= n, timeout=60, what=f"the {case} edit rejected")
        config.unlink()
        config.symlink_to("/dev/zero")
        wait_until(lambda: len(rejections()) >= len(cases) + 1, timeout=60, what="/dev/zero rejected")
        config.unlink()
        os.mkfifo(config)
        wait_until(lambda: len(rejections()) >= len(cases) + 2, timeout=60, what="the FIFO rejected")
        agent.send_signal(signal.SIGHUP)
        wait_until(lambda: len(rejections()) >= len(cases) + 3, timeout=60, what="the SIGHUP reload rejected")
        before = samples(metrics())[runs]
        wait_until(lambda: samples(metrics())[runs] >= before + 3, timeout=30, what="host still running")
        assert up(metrics(), "host") == 1
        assert rss_bytes(agent.pid) < 150 * 1024 * 1024
        agent.terminate()
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert rejections() == [
        f"{config}:3:23: not valid YAML: control character '\\x07' is not allowed",
        f"{config}: holds more than 10000 values once its aliases are expanded",
        f"{config}:1:76: not valid YAML: nested more than 64 levels deep",
        f"{config}:3: collectors.host.interval: expected a finite duration such as 15s, 500ms or 2m, got inf",
        f"{config}: cannot read: holds more than 131072 bytes",
        f"{config}: cannot read: is a device, not a regular file",
        f"{config}: cannot read: is a FIFO, not a regular file",
        f"{config}: cannot read: is a FIFO, not a regular file",  # the SIGHUP
    ]
    assert "Traceback" not in log.read_text()


def _answers(url: str) -> bool:
    try:
        return http_get(url + "/healthz", timeout=1)[0] == 200
    except OSError:
        return False


# --- training logs ---


def _training(*globs: Path | str) -> TrainingCollector:
    return TrainingCollector(context(options=TrainingOptions(logs=tuple(str(g) for g in globs), start_at="beginning")))


def _record(step: int, metric: str, value: object, rank: int = 0) -> str:
    return (
        json.dumps(
            {
                "ts": 1_767_312_000 + step,
                "job_id": "7",
                "rank": rank,
                "host": "h",
                "step": step,
                "metric": metric,
                "value": value,
            }
        )
        + "\n"
    )


def _good_steps(first: int, count: int, rank: int = 0) -> str:
    return "".join(
        _record(n, "step_time_sec", 1.0, rank) + _record(n, "compute_time_sec", 0.5, rank)
        for n in range(first, first + count)
    )


def _rank_value(values: dict, name: str, rank: int = 0) -> float:
    return values[(f"lockstep_training_{name}", frozenset({("job_id", "7"), ("rank", str(rank)), ("host", "h")}))]


@pytest.mark.parametrize("bad", [1e308, 10**400, -1, "1e3"], ids=["1e308", "400 digits", "negative", "string"])
def test_a_bad_training_value_is_counted_and_costs_nothing_else(tmp_path: Path, bad: object) -> None:
    log = tmp_path / "rank-0.jsonl"
    # A bad value, then ten good steps in the same read: all ten are counted.
    log.write_text(_good_steps(0, 2) + _record(2, "step_time_sec", bad) + _good_steps(3, 10))
    collector = _training(tmp_path / "*.jsonl")
    values = collected(collector)
    assert _rank_value(values, "steps_total") == 12
    assert _rank_value(values, "step_seconds_total") == 12.0
    reason = "bad_value"
    assert values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", reason)}))] == 1
    assert all(math.isfinite(v) for v in values.values())


@pytest.mark.parametrize("field,bad", [("ts", 10**400), ("ts", 1e308), ("rank", 10**400)])
def test_a_bad_timestamp_or_rank_is_counted_as_a_bad_record(tmp_path: Path, field: str, bad: object) -> None:
    log = tmp_path / "rank-0.jsonl"
    record = json.loads(_record(2, "step_time_sec", 1.0))
    record[field] = bad
    log.write_text(_good_steps(0, 2) + json.dumps(record) + "\n" + _good_steps(3, 10))
    values = collected(_training(tmp_path / "*.jsonl"))
    assert _rank_value(values, "steps_total") == 12
    assert values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", "bad_record")}))] == 1


@pytest.mark.parametrize("future_ts", [253402300799, "9999-12-31T23:59:59Z", 1_767_312_000 + 2 + 61])
def test_a_record_stamped_in_the_future_is_refused_and_never_pins_the_last_step(
    tmp_path: Path, future_ts: object
) -> None:
    """Issue 29 item 12: one step stamped in year 9999 pinned last_step_timestamp there, so the
    rank could never be seen as hung.  The agent's wall clock is the last good step's ts + 2 s;
    past it by more than the tolerance (60 s) a record is refused."""
    log = tmp_path / "rank-0.jsonl"
    future = json.loads(_record(2, "step_time_sec", 1.0))
    future["ts"] = future_ts
    # Steps 0 and 1 good, step 2's step time from the future, steps 3..12 good (ts up to +12).
    log.write_text(_good_steps(0, 2) + json.dumps(future) + "\n" + _good_steps(3, 10))
    collector = TrainingCollector(
        dataclasses.replace(
            context(options=TrainingOptions(logs=(str(tmp_path / "*.jsonl"),), start_at="beginning")),
            seams=Seams(WALL_CLOCK.replaced_by(lambda: 1_767_312_000 + 2)),
        )
    )
    values = collected(collector)
    assert _rank_value(values, "last_step_timestamp_seconds") == 1_767_312_000 + 12
    assert _rank_value(values, "steps_total") == 12
    assert values[("lockstep_training_log_lines_invalid_total", frozenset({("reason", "bad_record")}))] == 1


_TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _tcp_line(local: str, inode: str) -> str:
    rest = f"00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0 100 0 0 10 0"
    return f"   0: {local} {rest}\n"


def test_a_socket_link_or_port_the_kernel_never_writes_loses_that_socket_only(tmp_path: Path) -> None:
    """Issue 29 item 15: a `socket:[abc]` fd link or a non-hex port in net/tcp raised out of
    process discovery and failed the inference collector every round."""
    pid_dir = tmp_path / "proc" / "4242"
    (pid_dir / "fd").mkdir(parents=True)
    (pid_dir / "net").mkdir()
    for fd, target in (("3", "socket:[123]"), ("4", "socket:[abc]"), ("5", "socket:[]"), ("6", "socket:[124]")):
        (pid_dir / "fd" / fd).symlink_to(target)  # dangling, as /proc's are to anything but a file
    (pid_dir / "net" / "tcp").write_text(
        _TCP_HEADER
        + _tcp_line("0100007F:1F90", "123")  # 127.0.0.1:8080
        + _tcp_line("0100007F:ZZZZ", "124")  # a port that is not hex
        + _tcp_line("XX00007F:1F91", "124")  # an address that is not hex
    )
    (pid_dir / "net" / "tcp6").write_text(_TCP_HEADER)
    assert socket_inodes(tmp_path / "proc", 4242) == {123, 124}
    assert listening_sockets(tmp_path / "proc", 4242) == [ListeningSocket("127.0.0.1", 8080, 123)]


def test_a_double_star_glob_over_symlink_loops_ends(tmp_path: Path) -> None:
    logs = tmp_path / "logs" / "job=7"
    (logs / "a" / "b").mkdir(parents=True)
    (logs / "a" / "b" / "up").symlink_to("../..")  # a loop
    (logs / "self").symlink_to(".")  # another
    (logs / "a" / "b" / "rank-0.jsonl").write_text(_good_steps(0, 3))
    collector = _training(tmp_path / "logs" / "**" / "*.jsonl")
    result: list[dict] = []
    thread = threading.Thread(target=lambda: result.append(collected(collector)), daemon=True)
    thread.start()
    thread.join(60)  # Python's glob never returned here
    assert result, "the round did not end"
    assert _rank_value(result[0], "steps_total") == 3
    assert result[0][("lockstep_training_log_files", frozenset())] == 1  # the file once, not once per loop
    collector.close()


def test_the_files_followed_stay_within_a_quarter_of_the_descriptor_limit(tmp_path: Path) -> None:
    """200 ranks' logs, 64 descriptors: the collector follows 16 (a quarter of the limit), says
    once that the others are left unread, and the ones followed are never closed and read again
    from the start (the issue saw steps_total 4 for ranks that logged one step)."""
    for rank in range(200):
        (tmp_path / f"rank-{rank}.jsonl").write_text(_good_steps(0, 2, rank))
    script = (
        "import json, logging, resource, sys\n"
        "from pathlib import Path\n"
        "from tests.support import collected, context\n"
        "from lockstep.collectors.training import TrainingCollector, TrainingOptions\n"
        "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "c = TrainingCollector(context(options=TrainingOptions(logs=(sys.argv[1],), start_at='beginning')))\n"
        "rounds = [collected(c) for _ in range(4)]\n"
        "steps = [sorted(v for (n, _), v in r.items() if n == 'lockstep_training_steps_total') for r in rounds]\n"
        "skipped = [r[('lockstep_training_skipped_log_files', frozenset())] for r in rounds]\n"
        "print(json.dumps([steps, skipped]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "*.jsonl")], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rounds, skipped = json.loads(result.stdout)
    assert [len(steps) for steps in rounds] == [16] * 4
    assert all(set(steps) == {2} for steps in rounds)  # never more than the two steps logged
    assert skipped == [184] * 4
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert errors == [
        "ERROR some log files cannot be followed: 200 files match; following 16 at most (max_files), 184 left unread"
    ]


def test_running_out_of_file_descriptors_is_loud_and_never_rereads(tmp_path: Path) -> None:
    """200 ranks' logs, 64 descriptors of which something else took all but 10 (fewer than the
    collector's 16): the files that cannot be opened are reported as an error, and the ones
    followed are never closed and read again from the start (the issue saw steps_total 4 for
    ranks that logged one step)."""
    for rank in range(200):
        (tmp_path / f"rank-{rank}.jsonl").write_text(_good_steps(0, 2, rank))
    script = (
        "import json, logging, os, resource, sys\n"
        "from pathlib import Path\n"
        "from tests.support import collected, context\n"
        "from lockstep.collectors.training import TrainingCollector, TrainingOptions\n"
        "logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n"
        "c = TrainingCollector(context(options=TrainingOptions(logs=(sys.argv[1],), start_at='beginning')))\n"
        "taken = []\n"
        "try:\n"
        "    while True:\n"
        "        taken.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "for fd in taken[:10]:\n"
        "    os.close(fd)\n"
        "rounds = [collected(c) for _ in range(4)]\n"
        "steps = [sorted(v for (n, _), v in r.items() if n == 'lockstep_training_steps_total') for r in rounds]\n"
        "print(json.dumps(steps))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "*.jsonl")], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    rounds = json.loads(result.stdout)
    assert all(steps and set(steps) == {2} for steps in rounds)  # never more than the two steps logged
    assert len(rounds[-1]) < 16  # not even the collector's share could be followed
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    # Once per change (opening failed; then listing the directory did too), not per file or round.
    assert 1 <= len(errors) <= 2
    assert "out of file descriptors: " in errors[0]
    assert all("out of file descriptors" in e or "too many open files" in e for e in errors)


def test_more_matching_files_than_max_files_are_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for rank in range(8):
        (tmp_path / f"rank-{rank}.jsonl").write_text(_good_steps(0, 1, rank))
    follower = FileFollower([str(tmp_path / "*.jsonl")], start_at_end=False, max_files=5, log=logging.getLogger("t"))
    with caplog.at_level(logging.ERROR, logger="t"):
        for _ in range(3):
            list(follower.sweep())
    assert follower.followed == 5
    assert follower.skipped == 3
    assert [r.getMessage() for r in caplog.records] == [
        "some log files cannot be followed: 8 files match; following 5 at most (max_files), 3 left unread"
    ]
    follower.close()


# --- scontrol: whole-exchange deadline, process group killed, bounded output ---


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def test_a_hung_command_and_everything_it_started_are_killed_at_the_deadline(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; sleep 300"
    with pytest.raises(subprocess.TimeoutExpired):
        run_command(["sh", "-c", script], timeout=1.0)
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 3
    wait_until(lambda: not _alive(started), timeout=5, what="the command's whole group to be gone")


def test_children_left_by_a_command_that_exited_are_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The child closes the pipes, so the command's exit ends the exchange: its child must go too.
    out = run_command(["sh", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! >> {pids}; echo done"], timeout=10)
    assert out == "done\n"
    wait_until(lambda: not _alive([int(p) for p in pids.read_text().split()]), timeout=5, what="the orphan gone")


def test_binary_or_huge_command_output_is_refused_naming_the_command(tmp_path: Path) -> None:
    tool = tmp_path / "scontrol"
    tool.write_text("#!/bin/sh\nprintf 'JobId=1 \\377\\376\\000'\n")
    tool.chmod(0o755)
    with pytest.raises(CommandOutputError, match=r"^scontrol printed bytes that are not text \(at byte 8\)$"):
        run_command([str(tool)], timeout=10)
    # 300 MB: refused after 4 MiB, without holding it.
    with pytest.raises(CommandOutputError, match=r"^yes printed more than 4194304 bytes; its output is ignored$"):
        run_command(["yes", "x" * 1000], timeout=30)


def _scontrol_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return script


def test_empty_slurm_cgroup_directories_do_not_hide_the_listpids_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left behind after a switch to proctrack/linuxproc (or by a test run): slurm_<node>
    directories with no job cgroup in them.  The jobs come from `scontrol listpids`."""
    tree = tmp_path / "node"
    shutil.copytree(SLURM_FIXTURES / "nocgroup", tree, symlinks=True)
    for controller in ("memory", "freezer", "cpu,cpuacct"):
        (tree / "sys" / "fs" / "cgroup" / controller / "slurm_node07" / "uid_0").mkdir(parents=True)
    _scontrol_on_path(
        tmp_path,
        monkeypatch,
        f'[ "$1" = listpids ] && exec cat {SLURM_FIXTURES}/scontrol-listpids.txt\necho "no controller" >&2; exit 1\n',
    )
    collector = SlurmCollector(context(proc=tree / "proc", sys_=tree / "sys", options=SlurmOptions(node_name="node07")))
    values = collected(collector)
    assert values[("lockstep_slurm_job_processes", frozenset({("job_id", "501")}))] == 2


def test_a_hung_scontrol_wrapper_leaves_nothing_running_after_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    _scontrol_on_path(tmp_path, monkeypatch, f"sleep 600 & echo $! >> {pids}\necho $$ >> {pids}\nsleep 600\n")
    tree = SLURM_FIXTURES / "v2"
    config = tmp_path / "lockstep.yml"
    config.write_text("collectors:\n  slurm:\n    node_name: node07\n    controller_timeout: 60s\n")
    result = subprocess.run(
        [sys.executable, "-m", "lockstep.agent.cli", "once", "--config", str(config), "--collector.disable-defaults",
         "--collector.slurm", "--path.procfs", str(tree / "proc"), "--path.sysfs", str(tree / "sys")],
        capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ},
    )  # fmt: skip
    assert "lockstep_slurm_job_cpu_seconds_total" in result.stdout, result.stderr
    started = [int(p) for p in pids.read_text().split()]
    assert started  # the controller refresh did start the wrapper
    wait_until(lambda: not _alive(started), timeout=5, what="no scontrol left running after once")


def test_watchdogs_stopped_emitter_race_is_not_logged_as_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """Every shutdown logged watchdog's 'queue_events() called when the thread is inactive'
    ERROR (a race inside watchdog when an observer stops mid-read); its other messages pass."""
    setup_logging("info", "json")
    try:
        inotify = logging.getLogger("watchdog.observers.inotify")
        inotify.error("InotifyEmitter.queue_events() called when the thread is inactive")
        inotify.error("Unable to rebuild recursive inotify watches below '/x'")
        lines = [json.loads(line)["msg"] for line in capsys.readouterr().err.splitlines()]
    finally:
        logging.getLogger().handlers.clear()
    assert lines == ["Unable to rebuild recursive inotify watches below '/x'"]


# --- the fake NVML's spec (demo, tests): named errors, bounded ---


@pytest.mark.parametrize(
    "spec,problem",
    [
        (
            "gpus:\n  - processes:\n      - pid: -1\n",
            "{f}:3: gpus[0].processes[0].pid: expected a whole number of at least 0, got -1",
        ),
        (
            'gpus:\n  - processes:\n      - pid: "x"\n',
            "{f}:3: gpus[0].processes[0].pid: expected a whole number of at least 0, got 'x'",
        ),
        ("gpus: 100000000\n", "{f}:1: gpus: expected a list of GPUs or a number of GPUs up to 1024, got 100000000"),
        (
            "gpus:\n  - power_watts: .nan\n",
            "{f}:2: gpus[0].power_watts: expected a number from 0 to 2**64 - 1, got nan",
        ),
        (
            "gpus:\n  - power_watts: .inf\n",
            "{f}:2: gpus[0].power_watts: expected a number from 0 to 2**64 - 1, got inf",
        ),
        (
            "gpus:\n  - pci_bus_id: 'not a bus'\n",
            "{f}:2: gpus[0].pci_bus_id: expected a PCI bus id such as 00000000:18:00.0, got 'not a bus'",
        ),
    ],
    ids=["pid -1", "pid x", "1e8 gpus", "nan", "inf", "pci bus id"],
)
def test_a_bad_fake_nvml_spec_is_named_by_line(
    tmp_path: Path, spec: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gpus.yml"
    path.write_text(spec)
    assert cli.main(["once", "--gpu.fake-nvml", str(path)]) == 2
    assert capsys.readouterr().err == f"lockstep: --gpu.fake-nvml: {problem.format(f=path)}\n"


# --- generated inputs (hypothesis): whatever the value, a clear rejection or a valid result ---

GENERATED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(GENERATED, max_examples=30)
@given(st.text(max_size=200))
def test_any_config_text_loads_or_is_rejected_by_name(text: str) -> None:
    try:
        load_yaml_text(text, "gen.yml")
    except YamlFileError as exc:
        assert all(problem.startswith("gen.yml") for problem in exc.problems)


@GENERATED
@given(st.one_of(st.floats(), st.integers(), st.text(max_size=20), st.booleans(), st.none()))
def test_any_duration_is_within_bounds_or_rejected(value: object) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        assert str(exc)  # a message naming what was expected
    else:
        assert MIN_DURATION <= seconds <= MAX_DURATION


sample_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.text(max_size=5),
    st.none(),
)


@GENERATED
@given(st.lists(st.tuples(st.sampled_from(["counter", "gauge"]), st.text(max_size=8), sample_values), max_size=12))
def test_any_sample_values_render_after_the_domain_check(rows: list[tuple[str, str, object]]) -> None:
    families = []
    for kind, label, number in rows:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            f"lockstep_gen_{kind}", "Generated.", labels=["l"]
        )
        family.add_metric([label], number)  # type: ignore[arg-type]
        families.append(family)
    checked, _ = checked_families(families)
    text = generate_latest(_Registry(list(checked))).decode()  # never raises
    for (name, _labels), value in samples(text).items():
        assert math.isfinite(value)
        assert value >= 0 or not name.endswith("_total")


class _Registry:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


@settings(GENERATED, max_examples=25)
@given(st.binary(max_size=64))
def test_any_ib_counter_file_gives_a_64_bit_count_or_is_counted(sysfs: Path, content: bytes) -> None:
    (sysfs / MLX5_COUNTERS / "symbol_error").write_bytes(content)
    values = collected(InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions())))
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    symbol_errors = values.get(("lockstep_ib_port_symbol_errors_total", port))
    if symbol_errors is None:
        assert values[("lockstep_ib_port_unparseable_values_total", port)] == 1 or content.strip().startswith(b"N/A")
    else:
        assert 0 <= symbol_errors <= 2**64 - 1


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400), st.floats(), st.text(max_size=8)
)


@GENERATED
@given(st.lists(st.fixed_dictionaries({"value": json_scalars, "ts": json_scalars, "rank": json_scalars}), max_size=8))
def test_any_training_record_costs_only_itself(tmp_path_factory: pytest.TempPathFactory, bad: list[dict]) -> None:
    directory = tmp_path_factory.mktemp("gen")
    lines = []
    for record in bad:
        full = {"job_id": "7", "host": "h", "step": 1000, "metric": "step_time_sec", **record}
        lines.append(json.dumps(full) + "\n")
    (directory / "rank-0.jsonl").write_text(_good_steps(0, 3) + "".join(lines) + _good_steps(2000, 3))
    collector = _training(directory / "*.jsonl")
    first = collected(collector)
    assert _rank_value(first, "steps_total") >= 5  # the good steps around the generated ones
    assert all(math.isfinite(v) for v in first.values())
    with open(directory / "rank-0.jsonl", "a") as log:
        log.write(_good_steps(3000, 2))
    second = collected(collector)
    for key, value in first.items():
        if key[0].endswith("_total") and key in second:
            assert second[key] >= value  # counters only grow
    collector.close()


# --- inference engines: whole-exchange deadline, bounded body, values in their domain ---

VLLM_GOOD = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 3\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="m"} 2\n'
)


class _HostileEngines:
    """A real HTTP endpoint per behaviour: /good, /trickle (headers one byte at a time, for
    ever), /huge (31 MB), /liar (+Inf, negative gauges and counters), /twice (a repeated series)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                path = conn.recv(4096).split(b" ", 2)[1].decode()
                if path == "/trickle":
                    while not self.stop.wait(0.1):
                        conn.sendall(b"H")  # "HHHH..." never ends a status line
                    return
                body = {
                    "/good": VLLM_GOOD,
                    "/huge": "# " + "x" * (31 * 1024 * 1024) + "\n" + VLLM_GOOD,
                    "/liar": (
                        VLLM_GOOD.replace("} 2", "} -5")
                        + "# TYPE vllm:kv_cache_usage_perc gauge\n"
                        + 'vllm:kv_cache_usage_perc{model_name="m"} +Inf\n'
                        + "# TYPE vllm:num_preemptions_total counter\n"
                        + 'vllm:num_preemptions_total{model_name="m"} -100\n'
                    ),
                    "/twice": VLLM_GOOD + 'vllm:num_requests_running{model_name="m"} 4\n',
                }[path].encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            except (OSError, KeyError, IndexError):
                pass

    def close(self) -> None:
        self.stop.set()
        self.listener.shutdown(socket.SHUT_RDWR)  # ends the blocking accept
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def hostile_engines() -> Iterator[_HostileEngines]:
    engines = _HostileEngines()
    yield engines
    engines.close()


def _inference(*targets: str, timeout: float) -> InferenceCollector:
    options = InferenceOptions(targets=parse_targets(list(targets)), discover=False, timeout=timeout)
    return InferenceCollector(context(options=options))


def _engine_up(values: dict, url: str) -> float:
    """lockstep_inference_up of the endpoint (one series per model it served; all agree)."""
    ups = {v for (name, labels), v in values.items() if name == "lockstep_inference_up" and ("server", url) in labels}
    assert len(ups) == 1, ups
    return ups.pop()


def test_a_target_trickling_its_headers_never_starves_the_others(hostile_engines: _HostileEngines) -> None:
    """The timeout covered each socket read, not the whole exchange: every round leaked a
    thread, and after 16 rounds a healthy target reported up 0 and shutdown hung."""
    good, trickle = f"{hostile_engines.url}/good", f"{hostile_engines.url}/trickle"
    # Generous for the healthy target on a loaded machine; the trickler is cut at it anyway.
    collector = _inference(f"vllm={good}", f"vllm={trickle}", timeout=4)
    collected(collector)
    threads_after_one_round = threading.active_count()
    for _ in range(4):  # each of them leaked a thread before
        values = collected(collector)
        assert _engine_up(values, good) == 1
        assert _engine_up(values, trickle) == 0
    wait_until(
        lambda: threading.active_count() <= threads_after_one_round + 2, timeout=10, what="no leaked scrape threads"
    )
    collector.close()


def test_a_31_mb_engine_body_is_refused(hostile_engines: _HostileEngines, caplog: pytest.LogCaptureFixture) -> None:
    huge, good = f"{hostile_engines.url}/huge", f"{hostile_engines.url}/good"
    collector = _inference(f"vllm={huge}", f"vllm={good}", timeout=30)
    with caplog.at_level(logging.WARNING):
        values = collected(collector)
    assert _engine_up(values, huge) == 0 and _engine_up(values, good) == 1
    assert any(r.getMessage() == "inference target down: answer larger than 4 MiB" for r in caplog.records)
    collector.close()


def test_engine_values_outside_their_domain_are_left_out(
    hostile_engines: _HostileEngines, caplog: pytest.LogCaptureFixture
) -> None:
    liar, twice = f"{hostile_engines.url}/liar", f"{hostile_engines.url}/twice"
    collector = _inference(f"vllm={liar}", f"vllm={twice}", timeout=30)
    with caplog.at_level(logging.WARNING):
        values = collected(collector)
        collected(collector)  # the same values again: not logged again
    labels = {("engine", "vllm"), ("server", liar), ("model", "m")}
    assert values[("lockstep_inference_requests_running", frozenset(labels))] == 3
    assert ("lockstep_inference_requests_waiting", frozenset(labels)) not in values  # -5
    assert ("lockstep_inference_kv_cache_usage_ratio", frozenset(labels)) not in values  # +Inf
    assert ("lockstep_inference_preemptions_total", frozenset(labels)) not in values  # -100
    assert _engine_up(values, twice) == 0  # a repeated series is not summed into a made-up value
    messages = [r.getMessage() for r in caplog.records]
    example = 'vllm:num_preemptions_total{model_name="m"} = -100'
    assert messages.count(f"left out 3 values outside their domain, e.g. {example}") == 1
    twice_message = 'series vllm:num_requests_running{model_name="m"} appears twice: not valid exposition'
    assert f"inference target down: {twice_message}" in messages
    collector.close()


# --- checkpoint roots: user-writable tracker files, replaced roots ---


def _checkpoints(rootfs: Path, roots: list[dict[str, str]], now: float) -> CheckpointCollector:
    return CheckpointCollector(
        CollectorContext(
            paths=Paths(rootfs=rootfs),
            options=CheckpointOptions(roots=parse_roots(roots)),
            log=logging.getLogger("test"),
            seams=Seams(WALL_CLOCK.replaced_by(lambda: now)),
        )
    )


def _root_values(values: dict, root: str) -> dict[str, float]:
    return {
        name.removeprefix("lockstep_checkpoint_"): v
        for (name, labels), v in values.items()
        if ("root", root) in labels and name != "lockstep_checkpoint_info"
    }


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "huge"])
def test_a_hostile_megatron_tracker_is_skipped_by_name(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    bad, good = tmp_path / "ckpt" / "bad", tmp_path / "ckpt" / "good"
    for root in (bad, good):
        (root / "iter_0000050" / "mp_rank_00").mkdir(parents=True)
        (root / "iter_0000050" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"x" * 700)
    (good / "latest_checkpointed_iteration.txt").write_text("50\n")
    tracker = bad / "latest_checkpointed_iteration.txt"
    if kind == "/dev/zero":
        tracker.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(tracker)
    else:
        tracker.write_text("5" * 10_000_000)
    collector = _checkpoints(tmp_path, [{"path": "/ckpt/*", "watch": "poll"}], now)
    result: list[dict] = []
    with caplog.at_level(logging.WARNING):
        thread = threading.Thread(target=lambda: result.extend([collected(collector), collected(collector)]))
        thread.start()
        thread.join(60)  # a FIFO left the whole collector stuck
    assert len(result) == 2, "the rounds did not end"
    assert _root_values(result[1], "/ckpt/good")["last_size_bytes"] == 700  # the other root: complete
    assert _root_values(result[1], "/ckpt/bad")["root_readable"] == 1
    what = {
        "/dev/zero": "is a device, not a regular file",
        "fifo": "is a FIFO, not a regular file",
        "huge": "holds more than 64 bytes",
    }[kind]
    warnings = [r.getMessage() for r in caplog.records if "tracker" in r.getMessage()]
    assert warnings == [f"checkpoint root /ckpt/bad: skipping the tracker: {tracker} {what}"]
    collector.close()


def test_a_checkpoint_root_replaced_by_rename_and_mkdir_is_watched_again(tmp_path: Path) -> None:
    """Its inotify watch stayed on the renamed directory: saves in the new one went unseen
    until the rescan 5 minutes later."""
    now = time.time()
    root = tmp_path / "ckpt" / "job_7"
    root.mkdir(parents=True)
    collector = _checkpoints(tmp_path, [{"path": "/ckpt/job_7", "watch": "inotify"}], now + 10)
    collected(collector)
    root.rename(tmp_path / "ckpt" / "job_7.old")
    root.mkdir()
    collected(collector)  # sees the replacement
    (root / "iter_0000100" / "mp_rank_00").mkdir(parents=True)
    (root / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"x" * 1500)
    wait_until(
        lambda: _root_values(collected(collector), "/ckpt/job_7").get("in_progress_seconds", 0) > 0,
        timeout=20,
        what="the save in the new directory seen",
    )
    collector.close()
