"""Checkpoint collector: real files written by the test, for every recognised pattern, in
inotify and in polling mode, with every metric asserted.

Times: the test sets each file's mtime (os.utime) and the collector's wall clock (a fake,
through ``Seams.wall_clock``), so every value is exact.  The clock is always moved
forward *before* files are written, so an inotify event (stamped with the clock) never
predates the files' mtimes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.config import ConfigError, load_config
from lockstep.agent.seams import WALL_CLOCK, Seams
from lockstep.collectors.checkpoint import CheckpointCollector, CheckpointOptions
from lockstep.collectors.checkpoint.config import parse_roots
from lockstep.collectors.checkpoint.markers import final_name
from lockstep.collectors.checkpoint.watch import MAX_WATCH_DEPTH
from tests.support import (
    REPO,
    collected,
    wait_until,
)
from tests.support.served import of, self_metric, served

T = int(time.time()) - 100_000  # the tests' epoch: in the past, so real ctimes come after it
MODES = ("inotify", "poll")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write(path: Path, size: int, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))


class Harness:
    """One collector on a temp rootfs, with a fake clock; reads back one root's metrics."""

    def __init__(self, rootfs: Path, roots: Any, clock: Clock, procfs: Path | None = None, **options: Any) -> None:
        self.rootfs = rootfs
        self.clock = clock
        if procfs is None:
            # A mount table of one local root filesystem, not this machine's: the roots' storage
            # ("local") and `auto` watch mode must not depend on what / is where the tests run.
            procfs = rootfs / "_proc"
            (procfs / "self").mkdir(parents=True, exist_ok=True)
            (procfs / "self" / "mountinfo").write_text("22 1 252:2 / / rw - ext4 /dev/sda1 rw\n")
        context = CollectorContext(
            paths=Paths(procfs=procfs, rootfs=rootfs),
            options=CheckpointOptions(roots=parse_roots(roots), **options),
            log=logging.getLogger("test"),
            seams=Seams(WALL_CLOCK.replaced_by(clock)),
        )
        self.collector = CheckpointCollector(context)

    def scrape(self) -> dict:
        return collected(self.collector)

    def root(self, label: str) -> dict[str, Any]:
        """Every metric of one root: name (without the prefix) -> value; 'info' -> its labels."""
        out: dict[str, Any] = {}
        for (name, labels), value in self.scrape().items():
            labels = dict(labels)
            if labels.get("root") != label:
                continue
            short = name.removeprefix("lockstep_checkpoint_")
            if short == "info":
                out["info"] = {k: v for k, v in labels.items() if k != "root"}
            else:
                out[short] = value
        return out

    def until(self, label: str, mode: str, **expected: float) -> dict[str, Any]:
        """The root's metrics once they show ``expected``: at once when polling; an inotify
        scan follows the events, which arrive asynchronously."""
        if mode == "poll":
            got = self.root(label)
            assert {k: got.get(k) for k in expected} == expected
            return got

        def matching() -> dict[str, Any] | None:
            got = self.root(label)
            return got if {k: got.get(k) for k in expected} == expected else None

        return wait_until(matching, timeout=10, what=f"{expected} (last: {self.root(label)})")  # type: ignore[no-any-return]


@pytest.fixture
def harnesses() -> Iterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for h in made:
        h.collector.close()


def harness(made: list[Harness], *args: Any, **kwargs: Any) -> Harness:
    h = Harness(*args, **kwargs)
    made.append(h)
    return h


@pytest.mark.parametrize("mode", MODES)
def test_pytorch_dcp_lifecycle(tmp_path: Path, mode: str, harnesses: list[Harness]) -> None:
    root = tmp_path / "ckpt" / "job=77"
    # Complete before the agent starts: history (the last success), not counted as a new save.
    write(root / "step_050" / "__0_0.distcp", 100, T - 200)
    write(root / "step_050" / ".metadata", 10, T - 150)
    clock = Clock(T + 10)
    h = harness(harnesses, tmp_path, [{"path": "/ckpt/job=*", "watch": mode, "expected_interval": "10m"}], clock)
    label = "/ckpt/job=77"
    got = h.root(label)
    assert got == {
        "info": {"pattern": "/ckpt/job=*", "job_id": "77", "format": "dcp", "watch": mode, "storage": "local"},
        "saves_total": 0,
        "in_progress_seconds": 0,
        "last_success_timestamp_seconds": T - 150,
        "last_duration_seconds": 50,
        "last_size_bytes": 110,
        "last_write_throughput_bytes_per_second": 110 / 50,
        "expected_interval_seconds": 600,
        "root_readable": 1,
        "scan_truncated": 0,
        "skipped_directories": 0,
    }
    assert h.scrape()[("lockstep_checkpoint_roots", frozenset({("pattern", "/ckpt/job=*")}))] == 1

    # A save starts: shards, no .metadata.
    write(root / "step_100" / "__0_0.distcp", 1000, T)
    write(root / "step_100" / "__1_0.distcp", 2000, T + 4)
    got = h.until(label, mode, in_progress_seconds=10)
    assert (got["saves_total"], got["last_success_timestamp_seconds"]) == (0, T - 150)
    # Stalled: the in-progress time keeps growing with the clock.
    for now in (T + 25, T + 700, T + 3600):
        clock.now = now
        assert h.root(label)["in_progress_seconds"] == now - T
    # .metadata: the save is complete, ending at its mtime.
    clock.now = T + 3610
    write(root / "step_100" / ".metadata", 500, T + 3605)
    got = h.until(label, mode, saves_total=1)
    assert got == {
        **got,
        "in_progress_seconds": 0,
        "last_success_timestamp_seconds": T + 3605,
        "last_duration_seconds": 3605,
        "last_size_bytes": 3500,
        "last_write_throughput_bytes_per_second": 3500 / 3605,
    }
    # A second save, quick this time.
    clock.now = T + 4000
    write(root / "step_200" / "__0_0.distcp", 4000, T + 3990)
    write(root / "step_200" / ".metadata", 1000, T + 3998)
    got = h.until(label, mode, saves_total=2)
    assert (got["last_duration_seconds"], got["last_size_bytes"], got["in_progress_seconds"]) == (8, 5000, 0)
    assert got["last_write_throughput_bytes_per_second"] == 5000 / 8


@pytest.mark.parametrize("mode", MODES)
def test_nemo_unfinished_marker(tmp_path: Path, mode: str, harnesses: list[Harness]) -> None:
    root = tmp_path / "exp" / "checkpoints"
    root.mkdir(parents=True)
    clock = Clock(T + 10)
    h = harness(harnesses, tmp_path, [{"path": "/exp/checkpoints", "watch": mode}], clock)
    label = "/exp/checkpoints"
    got = h.root(label)
    assert (got["saves_total"], got["in_progress_seconds"], got["info"]["format"]) == (0, 0, "unknown")
    assert "last_success_timestamp_seconds" not in got and "expected_interval_seconds" not in got
    name = "megatron_gpt--val_loss=2.10-step=100-consumed_samples=800.0-last"
    write(root / f"{name}-unfinished", 0, T)  # NeMo writes the marker first
    write(root / f"{name}.ckpt" / "model_weights" / "shard_0.pt", 3000, T + 5)
    write(root / f"{name}.ckpt" / "optimizer.pt", 6000, T + 8)
    got = h.until(label, mode, in_progress_seconds=10)
    assert (got["saves_total"], got["info"]["format"]) == (0, "nemo")
    clock.now = T + 20
    (root / f"{name}-unfinished").unlink()
    got = h.until(label, mode, saves_total=1)
    assert got == {
        "info": {"pattern": "/exp/checkpoints", "job_id": "", "format": "nemo", "watch": mode, "storage": "local"},
        "saves_total": 1,
        "in_progress_seconds": 0,
        "last_success_timestamp_seconds": T + 8,  # the newest file of the save
        "last_duration_seconds": 8,  # from the marker
        "last_size_bytes": 9000,
        "last_write_throughput_bytes_per_second": 9000 / 8,
        "root_readable": 1,
        "scan_truncated": 0,
        "skipped_directories": 0,
    }


@pytest.mark.parametrize("mode", MODES)
def test_megatron_tracker_file(tmp_path: Path, mode: str, harnesses: list[Harness]) -> None:
    root = tmp_path / "scratch" / "gpt3-job_4242"
    write(root / "iter_0000050" / "mp_rank_00" / "model_optim_rng.pt", 700, T - 60)
    write(root / "iter_0000050" / "mp_rank_01" / "model_optim_rng.pt", 700, T - 55)
    write(root / "latest_checkpointed_iteration.txt", 0, T - 50)
    (root / "latest_checkpointed_iteration.txt").write_text("50")
    os.utime(root / "latest_checkpointed_iteration.txt", (T - 50, T - 50))
    clock = Clock(T + 10)
    h = harness(harnesses, tmp_path, [{"path": "/scratch/*/", "watch": mode}], clock)
    label = "/scratch/gpt3-job_4242"
    got = h.root(label)
    assert got["info"] == {
        "pattern": "/scratch/*/",
        "job_id": "4242",
        "format": "megatron",
        "watch": mode,
        "storage": "local",
    }
    assert (got["saves_total"], got["last_success_timestamp_seconds"], got["last_duration_seconds"]) == (0, T - 50, 10)
    assert got["last_size_bytes"] == 1400

    write(root / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt", 1500, T + 3)
    write(root / "iter_0000100" / "mp_rank_01" / "model_optim_rng.pt", 1500, T + 6)
    h.until(label, mode, in_progress_seconds=7)
    clock.now = T + 20
    (root / "latest_checkpointed_iteration.txt").write_text("100\n")
    os.utime(root / "latest_checkpointed_iteration.txt", (T + 12, T + 12))
    got = h.until(label, mode, saves_total=1)
    assert got == {
        **got,
        "in_progress_seconds": 0,
        "last_success_timestamp_seconds": T + 12,
        "last_duration_seconds": 9,
        "last_size_bytes": 3000,
        "last_write_throughput_bytes_per_second": 3000 / 9,
    }


@pytest.mark.parametrize("mode", MODES)
def test_generic_quiet_period(tmp_path: Path, mode: str, harnesses: list[Harness]) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    clock = Clock(T + 5)
    h = harness(harnesses, tmp_path, [{"path": "/ckpt", "watch": mode, "quiet_period": "30s"}], clock)
    label = "/ckpt"
    h.root(label)
    write(root / "model_step5.pt", 4096, T + 2)
    h.until(label, mode, in_progress_seconds=3)
    clock.now = T + 20  # quiet for 18 s: not yet 30
    assert h.root(label)["in_progress_seconds"] == 18
    clock.now = T + 40
    got = h.root(label)
    assert got == {
        "info": {"pattern": "/ckpt", "job_id": "", "format": "generic", "watch": mode, "storage": "local"},
        "saves_total": 1,
        "in_progress_seconds": 0,
        "last_success_timestamp_seconds": T + 2,
        "last_duration_seconds": 0,
        "last_size_bytes": 4096,
        "root_readable": 1,
        "scan_truncated": 0,
        "skipped_directories": 0,
    }  # a save of zero duration has no throughput


@pytest.mark.parametrize("mode", MODES)
def test_generic_temp_name_renamed(tmp_path: Path, mode: str, harnesses: list[Harness]) -> None:
    """Hugging Face Trainer: tmp-checkpoint-500/ written, then renamed to checkpoint-500/."""
    root = tmp_path / "out"
    root.mkdir()
    clock = Clock(T + 10)
    h = harness(harnesses, tmp_path, [{"path": "/out", "watch": mode, "quiet_period": "1h"}], clock)
    label = "/out"
    h.root(label)
    write(root / "tmp-checkpoint-500" / "model.safetensors", 5000, T + 1)
    write(root / "tmp-checkpoint-500" / "optimizer.pt", 10000, T + 3)
    h.until(label, mode, in_progress_seconds=9)
    clock.now = T + 100  # a stale temporary name stays in progress, however quiet
    assert h.root(label)["in_progress_seconds"] == 99
    os.rename(root / "tmp-checkpoint-500", root / "checkpoint-500")
    renamed_at = os.stat(root / "checkpoint-500").st_ctime  # renaming sets the ctime
    got = h.until(label, mode, saves_total=1)
    assert got == {
        **got,
        "in_progress_seconds": 0,
        "last_success_timestamp_seconds": renamed_at,
        "last_duration_seconds": renamed_at - (T + 1),
        "last_size_bytes": 15000,
        "last_write_throughput_bytes_per_second": 15000 / (renamed_at - (T + 1)),
    }


def test_abandoned_leftover_is_not_in_progress(tmp_path: Path, harnesses: list[Harness]) -> None:
    root = tmp_path / "ckpt"
    write(root / "step_010" / "__0_0.distcp", 10, T - 500)  # a crashed job's incomplete save
    write(root / "step_050" / "__0_0.distcp", 10, T - 100)
    write(root / "step_050" / ".metadata", 10, T - 90)
    h = harness(harnesses, tmp_path, [{"path": "/ckpt", "watch": "poll"}], Clock(T))
    assert h.root("/ckpt")["in_progress_seconds"] == 0


def test_empty_save_directory_is_a_save_in_progress(tmp_path: Path, harnesses: list[Harness]) -> None:
    """DCP makes the directory first: a save stuck before its first shard shows as in progress."""
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "step_100").mkdir()
    os.utime(root / "step_100", (T, T))
    h = harness(harnesses, tmp_path, [{"path": "/ckpt", "watch": "poll"}], Clock(T + 30))
    assert h.root("/ckpt")["in_progress_seconds"] == 30


def test_glob_roots_come_and_go_and_missing_roots_are_reported(tmp_path: Path, harnesses: list[Harness]) -> None:
    clock = Clock(T)
    h = harness(harnesses, tmp_path, ["/lustre/ckpt/*", "/fixed/root"], clock)
    s = h.scrape()
    assert s[("lockstep_checkpoint_roots", frozenset({("pattern", "/lustre/ckpt/*")}))] == 0
    assert s[("lockstep_checkpoint_roots", frozenset({("pattern", "/fixed/root")}))] == 1
    # A plain path that does not exist is reported unreadable, not a failure.
    assert h.root("/fixed/root")["root_readable"] == 0
    (tmp_path / "lustre/ckpt/job=1").mkdir(parents=True)
    (tmp_path / "lustre/ckpt/job=2").mkdir()
    (tmp_path / "fixed/root").mkdir(parents=True)
    s = h.scrape()
    assert s[("lockstep_checkpoint_roots", frozenset({("pattern", "/lustre/ckpt/*")}))] == 2
    assert h.root("/fixed/root")["root_readable"] == 1
    assert h.root("/lustre/ckpt/job=2")["info"]["job_id"] == "2"
    (tmp_path / "lustre/ckpt/job=2").rmdir()
    assert h.root("/lustre/ckpt/job=2") == {}
    # Watched with inotify (a local directory): its removal is seen from the event.
    assert h.root("/fixed/root")["info"]["watch"] == "inotify"
    (tmp_path / "fixed/root").rmdir()
    h.until("/fixed/root", "inotify", root_readable=0)
    # A root that is a file, not a directory: also unreadable, never a crash.
    (tmp_path / "fixed/root").write_text("")
    assert h.root("/fixed/root")["root_readable"] == 0


@pytest.mark.real
def test_permission_denied_is_reported(tmp_path: Path) -> None:
    """Run as an unprivileged user (root reads anything), in a child process."""
    root = tmp_path / "ckpt"
    root.mkdir()
    root.chmod(0o000)
    tmp_path.chmod(0o755)
    code = f"""
import logging, os, sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.seams import Seams
from lockstep.collectors.checkpoint import CheckpointCollector, CheckpointOptions
from lockstep.collectors.checkpoint.config import parse_roots
from lockstep.agent.seams import WALL_CLOCK
logging.basicConfig()
options = CheckpointOptions(roots=parse_roots([{{"path": "/ckpt", "watch": "poll"}}]))
c = CheckpointCollector(CollectorContext(Paths(rootfs=Path({str(tmp_path)!r})),
    options, logging.getLogger("t"), Seams(WALL_CLOCK.replaced_by(lambda: 0.0))))
if os.geteuid() == 0:  # imports done: the interpreter's own files may not be readable by nobody
    os.setgid(65534); os.setuid(65534)
for family in list(c.collect()):
    for sample in family.samples:
        if sample.name == "lockstep_checkpoint_root_readable":
            print(sample.value)
"""
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        root.chmod(0o755)
    assert (result.returncode, float(result.stdout)) == (0, 0), result.stderr
    assert "permission denied reading" in result.stderr


def test_scan_is_capped_and_reports_it(tmp_path: Path, harnesses: list[Harness]) -> None:
    root = tmp_path / "ckpt"
    for i in range(50):
        write(root / "step_100" / f"__{i}_0.distcp", 1, T)
    h = harness(harnesses, tmp_path, [{"path": "/ckpt", "watch": "poll"}], Clock(T + 10), max_files=20)
    got = h.root("/ckpt")
    assert got["scan_truncated"] == 1
    assert got["in_progress_seconds"] == 10
    h.collector.options = dataclasses.replace(h.collector.options, max_files=1000)
    assert h.root("/ckpt")["scan_truncated"] == 0


def test_auto_watch_polls_network_filesystems_and_says_where_each_root_is(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    """A root on a network or FUSE filesystem is polled and "shared"; one on the node's own disk
    is watched and "local" (the rules name a node-local root's stalled save's node, alerts/nodes.py)."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self/mountinfo").write_text(
        "22 1 252:2 / / rw - ext4 /dev/sda1 rw\n31 22 0:50 / /lustre rw - lustre 10.0.0.1@o2ib:/scratch rw\n"
        "32 22 0:51 / /s3 rw - fuse.s3fs s3fs rw\n"
    )
    for root in ("lustre/ckpt", "local/ckpt", "s3/ckpt"):
        (tmp_path / root).mkdir(parents=True)
    h = harness(harnesses, tmp_path, ["/lustre/ckpt", "/local/ckpt", "/s3/ckpt"], Clock(T), procfs=proc)
    where = {
        root: (h.root(root)["info"]["watch"], h.root(root)["info"]["storage"])
        for root in ("/lustre/ckpt", "/local/ckpt", "/s3/ckpt")
    }
    assert where == {
        "/lustre/ckpt": ("poll", "shared"),
        "/local/ckpt": ("inotify", "local"),
        "/s3/ckpt": ("poll", "shared"),
    }


def test_a_root_whose_mount_table_cannot_be_read_has_no_storage_and_is_watched(
    tmp_path: Path, harnesses: list[Harness]
) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "ckpt").mkdir()
    h = harness(harnesses, tmp_path, ["/ckpt"], Clock(T), procfs=tmp_path / "proc")
    assert (h.root("/ckpt")["info"]["watch"], h.root("/ckpt")["info"]["storage"]) == ("inotify", "")


def test_no_roots_is_nothing_here(tmp_path: Path, harnesses: list[Harness]) -> None:
    h = harness(harnesses, tmp_path, [], Clock(T))
    with pytest.raises(NothingHere, match="no checkpoint roots configured"):
        h.scrape()


def test_temporary_names() -> None:
    assert final_name("tmp-checkpoint-500") == ("checkpoint-500", True)
    assert final_name(".model.pt.tmp") == ("model.pt", True)
    assert final_name("model.pt.partial") == ("model.pt", True)
    assert final_name("checkpoint-500") == ("checkpoint-500", False)
    assert final_name("tmp-") == ("tmp-", False)


def test_roots_config_schema_and_errors(tmp_path: Path) -> None:
    config = tmp_path / "lockstep.yml"
    config.write_text(
        "collectors:\n"
        "  checkpoint:\n"
        "    roots:\n"
        "      - /lustre/ckpt/*\n"
        "      - path: /scratch/job=*/ckpt\n"
        "        expected_interval: 30m\n"
        "        watch: poll\n"
        "        quiet_period: 2m\n"
        "    max_files: 5000\n"
    )
    settings = load_config(config, {"checkpoint": CheckpointCollector}).collectors["checkpoint"]
    assert isinstance(settings.options, CheckpointOptions)
    first, second = settings.options.roots
    assert (first.pattern, first.expected_interval, first.watch) == ("/lustre/ckpt/*", None, "auto")
    assert first.quiet_period == 60
    assert (second.pattern, second.expected_interval, second.watch, second.quiet_period) == (
        "/scratch/job=*/ckpt",
        1800,
        "poll",
        120,
    )
    assert settings.options.max_files == 5000
    for bad, message in (
        ("roots: [ckpt]", "root 1: expected an absolute path, got 'ckpt'"),
        ("roots: [{path: /x, watch: fanotify}]", "root 1: expected one of auto, inotify, poll, got 'fanotify'"),
        ("roots: [/a, {path: /x, every: 5m}]", "root 2: unknown key 'every'"),
        ("roots: [{expected_interval: 5m}]", "root 1: 'path' is required"),
        ("job_id_pattern: 'job=\\d+'", "needs one (group)"),
    ):
        config.write_text(f"collectors:\n  checkpoint:\n    {bad}\n")
        with pytest.raises(ConfigError) as error:
            load_config(config, {"checkpoint": CheckpointCollector})
        assert f"{config}:3: collectors.checkpoint." in str(error.value)
        assert message in str(error.value)


def test_simulated_node_saves_every_ten_minutes(tmp_path: Path, harnesses: list[Harness]) -> None:
    """The demo's checkpoint root, moved along in simulated time: a save starts, then completes."""
    from lockstep.simulation import SimulatedNode
    from lockstep.simulation.storage import EPOCH

    node = SimulatedNode(tmp_path, "healthy")
    context = CollectorContext(
        paths=node.paths,
        options=CheckpointOptions(roots=parse_roots(node.options["checkpoint"]["roots"])),
        log=logging.getLogger("test"),
        seams=node.seams,
    )
    collector = CheckpointCollector(context)
    h = Harness.__new__(Harness)
    h.collector, h.clock = collector, Clock(0)
    harnesses.append(h)
    label = "/lustre/ckpt/job=4242"
    got = h.root(label)
    assert (got["saves_total"], got["in_progress_seconds"], got["info"]["watch"]) == (0, 0, "poll")
    assert got["last_success_timestamp_seconds"] == EPOCH - 455  # save 11 ended 455 s before t=0
    node.render(120.0)  # save 12 began at t=100; its first shard finished at t=105
    assert h.root(label)["in_progress_seconds"] == 15
    node.render(150.0)  # .metadata at t=145
    got = h.root(label)
    assert (got["saves_total"], got["in_progress_seconds"]) == (1, 0)
    assert got["last_success_timestamp_seconds"] == EPOCH + 145
    assert got["last_size_bytes"] == 8 * 2 * 1024**3 + 1_572_864


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


def test_a_non_utf8_directory_under_a_checkpoint_root_costs_nothing_of_its_neighbour(tmp_path: Path) -> None:
    now = time.time()
    parent = tmp_path / "ckpt"
    for name in (b"good", b"bad\xff"):  # \xff never appears in UTF-8
        root = os.path.join(os.fsencode(parent), name)
        os.makedirs(os.path.join(root, b"iter_0000050", b"mp_rank_00"))
        with open(os.path.join(root, b"iter_0000050", b"mp_rank_00", b"model_optim_rng.pt"), "wb") as f:
            f.write(b"x" * 700)
        with open(os.path.join(root, b"latest_checkpointed_iteration.txt"), "wb") as f:
            f.write(b"50\n")
    collector = _checkpoints(tmp_path, [{"path": "/ckpt/*", "watch": "poll"}], now)
    try:
        result = served(collector)
    finally:
        collector.close()
    for values in (result.text, result.openmetrics):
        assert of(values, "lockstep_checkpoint_last_size_bytes", root="/ckpt/good") == 700
        # Python reads the byte 0xff of a file name as the lone surrogate \udcff: escaped.
        assert of(values, "lockstep_checkpoint_last_size_bytes", root="/ckpt/bad\\udcff") == 700
    bad_series = [labels for name, labels in result.text if ("root", "/ckpt/bad\\udcff") in labels]
    assert self_metric(result, "up", "checkpoint") == 1
    assert self_metric(result, "altered_label_values_total", "checkpoint") == len(bad_series) == 10


# --- item 5: a directory 1,000 levels deep under a checkpoint root ---


def _deep_tree(top: Path, levels: int) -> None:
    """``top`` and ``levels`` directories nested under it (os.makedirs is recursive: it cannot)."""
    path = top
    path.mkdir()
    for _ in range(levels):
        path = path / "d"
        path.mkdir()


def _remove_deep_tree(top: Path) -> None:
    """Remove what _deep_tree made (shutil.rmtree, pytest's cleanup, is recursive too)."""
    path = top
    while (path / "d").is_dir():
        path = path / "d"
    while path != top.parent:
        path.rmdir()
        path = path.parent


def _save(root: Path, name: str, mtime: float) -> None:
    """A complete PyTorch DCP save: one 1,000-byte shard, then .metadata (100 bytes)."""
    (root / name).mkdir()
    for file, size, when in (("__0_0.distcp", 1000, mtime - 10), (".metadata", 100, mtime)):
        (root / name / file).write_bytes(b"x" * size)
        os.utime(root / name / file, (when, when))


def test_a_directory_1000_levels_deep_is_not_watched_and_costs_no_root_its_data(tmp_path: Path) -> None:
    """Two roots watched with inotify; one holds a directory 1,000 levels deep from the start,
    and the other gets one after its watch started.  Watchdog's recursive watch raised
    RecursionError: the first made the collector fail every round, for both roots; the second
    stopped the agent's inotify thread, so no later save was seen.  Now each deep tree is
    watched down to MAX_WATCH_DEPTH levels, the directory at that depth counted (1: nothing
    below it is walked), and the healthy root's saves are seen through inotify with exact
    values.  Once the deep tree is removed, nothing is counted any more."""
    now = time.time()
    deep, good = tmp_path / "ckpt" / "deep", tmp_path / "ckpt" / "good"
    deep.parent.mkdir()
    _deep_tree(deep, 1000)
    good.mkdir()
    _save(good, "step_1", now - 100)
    collector = _checkpoints(tmp_path, [{"path": "/ckpt/*", "watch": "inotify"}], now)
    try:
        values = collected(collector)
        assert MAX_WATCH_DEPTH == 16
        assert _root_values(values, "/ckpt/deep")["skipped_directories"] == 1
        assert _root_values(values, "/ckpt/good") == {
            "saves_total": 0,
            "in_progress_seconds": 0,
            "last_success_timestamp_seconds": now - 100,
            "last_duration_seconds": 10,
            "last_size_bytes": 1100,
            "last_write_throughput_bytes_per_second": 110,
            "root_readable": 1,
            "scan_truncated": 0,
            "skipped_directories": 0,
        }
        _deep_tree(good / "attack", 1000)  # made under a live watch, level by level
        _save(good, "step_2", now - 5)
        # Seen through the watch (the collector rescans a watched root only after an event).
        values = wait_until(
            lambda: (v := collected(collector)) and _root_values(v, "/ckpt/good")["saves_total"] == 1 and v,
            timeout=10,
            what="the save made after the deep tree to be seen",
        )
        good_values = _root_values(values, "/ckpt/good")
        assert good_values["last_success_timestamp_seconds"] == now - 5
        assert good_values["last_size_bytes"] == 1100
        assert good_values["skipped_directories"] == 1
        assert [t.name for t in threading.enumerate() if t.name == "checkpoint-inotify"] == ["checkpoint-inotify"]
        _remove_deep_tree(good / "attack")
        wait_until(
            lambda: _root_values(collected(collector), "/ckpt/good")["skipped_directories"] == 0,
            timeout=10,
            what="the removed deep tree to be counted no more",
        )
    finally:
        collector.close()
        for top in (deep, good / "attack"):
            if top.exists():
                _remove_deep_tree(top)


def test_a_root_reached_through_a_symlink_is_watched(tmp_path: Path) -> None:
    """The depth-bounded watch follows the root itself when it is a symlink (as watchdog did),
    never a symlink below it."""
    now = time.time()
    (tmp_path / "real").mkdir()
    (tmp_path / "ckpt").symlink_to(tmp_path / "real")
    collector = _checkpoints(tmp_path, [{"path": "/ckpt", "watch": "inotify"}], now)
    try:
        values = collected(collector)
        info = [dict(labels) for (name, labels) in values if name == "lockstep_checkpoint_info"]
        assert [i["watch"] for i in info] == ["inotify"]
        _save(tmp_path / "real", "step_1", now - 5)
        got = wait_until(
            lambda: (v := _root_values(collected(collector), "/ckpt"))["saves_total"] == 1 and v,
            timeout=10,
            what="the save seen through the watch",
        )
        assert (got["last_success_timestamp_seconds"], got["last_size_bytes"]) == (now - 5, 1100)
    finally:
        collector.close()
