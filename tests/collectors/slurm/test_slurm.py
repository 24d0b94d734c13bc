"""Slurm collector on fixture trees of every cgroup layout, with captured scontrol output."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lockstep.agent.collector import NothingHere
from lockstep.agent.samples import safe_label_value
from lockstep.agent.seams import Seams
from lockstep.collectors.slurm import SlurmCollector, SlurmOptions
from lockstep.collectors.slurm.gres import MAX_GRES_INDICES, expand_brackets, expand_ranges, parse_gres_conf
from lockstep.collectors.slurm.scontrol import SCONTROL
from tests.support import (
    FIXTURES,
    REPO,
    alive,
    collected,
    context,
    wait_until,
)
from tests.support.scontrol import SLURM, captured_scontrol, fake_scontrol
from tests.support.served import of, self_metric, served

SLURM_FIXTURES = FIXTURES / "slurm"


def captured() -> Seams:
    """scontrol answered in-process from captured output (tests/support/scontrol.py)."""
    return Seams(SCONTROL.replaced_by(captured_scontrol()))


def collect(layout: str, seams: Seams | None = None, **options: Any) -> dict:
    """One round on a fixture tree; scontrol is the captured one unless ``seams`` says otherwise
    (``Seams()``: the program on PATH, for the tests that run it)."""
    collector = SlurmCollector(
        context(
            proc=SLURM / layout / "proc",
            sys_=SLURM / layout / "sys",
            options=SlurmOptions(node_name="node07", **options),
            seams=captured() if seams is None else seams,
        )
    )
    return collected(collector)


def info(job_id: str, user: str, account: str, partition: str, name: str, array_job: str = "", task: str = "") -> tuple:
    labels = {
        "job_id": job_id,
        "user": user,
        "account": account,
        "partition": partition,
        "job_name": name,
        "array_job_id": array_job,
        "array_task_id": task,
    }
    return ("lockstep_slurm_job_info", frozenset(labels.items()))


def job(name: str, job_id: str) -> tuple:
    return (name, frozenset({("job_id", job_id)}))


@pytest.mark.real
def test_cgroup_v2_environ_and_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_scontrol(tmp_path, monkeypatch)
    s = collect("v2", seams=Seams())
    # Job 101's processes' environment is readable: no controller call for it.
    assert s[info("101", "alice", "llm", "gpu", "pretrain 70b")] == 1
    # Job 102 has no readable environment: one `scontrol show job` (captured real output).
    assert s[info("102", "lockstep-bob", "", "gpu", "bobjob")] == 1
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "101")] == 123.456789
    assert s[job("lockstep_slurm_job_memory_used_bytes", "101")] == 8589934592
    assert s[job("lockstep_slurm_job_oom_kills_total", "101")] == 1
    assert s[job("lockstep_slurm_job_processes", "101")] == 3
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "102")] == 5.0
    assert s[job("lockstep_slurm_job_oom_kills_total", "102")] == 0
    node = {
        ("slurm_node", "node07"),
        ("state", "MIXED+DRAIN"),
        ("reason", "bad GPU 3: XID 79 [ops] [root@2026-11-21T23:24:27]"),
    }
    assert s[("lockstep_slurm_node_info", frozenset(node))] == 1
    assert s[("lockstep_slurm_node_state", frozenset({("state", "drain")}))] == 1
    assert s[("lockstep_slurm_node_state", frozenset({("state", "mixed")}))] == 1
    assert log.read_text().splitlines() == ["-d -o show job 102", "-o show node node07"]
    requests = "lockstep_slurm_controller_requests_total"
    assert s[(requests, frozenset({("command", "scontrol show job")}))] == 1
    assert s[(requests, frozenset({("command", "scontrol show node")}))] == 1
    # Only real job directories count: the scope's own "system" cgroup is not a job.
    assert sorted(k[1] for k in s if k[0] == "lockstep_slurm_job_processes") == [
        frozenset({("job_id", "101")}),
        frozenset({("job_id", "102")}),
    ]


def test_multiple_slurmd_scope_and_array_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = collect("multi")
    assert s[info("201", "bob", "", "debug", "sweep", "200", "3")] == 1
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "201")] == 2.5
    assert s[job("lockstep_slurm_job_memory_used_bytes", "201")] == 4096


def test_cgroup_v1_hierarchies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = collect("v1")
    assert s[info("301", "carol", "vision", "gpu", "resnet")] == 1
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "301")] == 42.0  # cpuacct.usage is ns
    assert s[job("lockstep_slurm_job_memory_used_bytes", "301")] == 2147483648
    assert s[job("lockstep_slurm_job_oom_kills_total", "301")] == 2
    assert s[job("lockstep_slurm_job_processes", "301")] == 1


def test_sluid_named_job_directory_reports_the_job_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = collect("sluid")
    assert s[info("401", "dave", "rl", "gpu", "ppo")] == 1
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "401")] == 1.0


@pytest.mark.real
def test_controller_calls_are_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_scontrol(tmp_path, monkeypatch)
    collector = SlurmCollector(
        context(
            proc=SLURM / "v2" / "proc",
            sys_=SLURM / "v2" / "sys",
            options=SlurmOptions(node_name="node07", controller_interval=3600.0),
        )
    )
    for _ in range(5):
        list(collector.collect())
    assert len(log.read_text().splitlines()) == 2  # one round: the job and the node, once


@pytest.mark.real
def test_slow_controller_never_stalls_a_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = fake_scontrol(tmp_path, monkeypatch, delay=30)
    collector = SlurmCollector(
        context(
            proc=SLURM / "v2" / "proc",
            sys_=SLURM / "v2" / "sys",
            options=SlurmOptions(node_name="node07", controller_wait=0.2, controller_timeout=1.0),
        )
    )
    started = time.monotonic()
    s = collected(collector)
    assert time.monotonic() - started < 5  # waited 0.2 s, not 30
    assert s[info("101", "alice", "llm", "gpu", "pretrain 70b")] == 1  # local data still there
    assert not [k for k in s if k[0] == "lockstep_slurm_job_info" and ("job_id", "102") in k[1]]
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "102")] == 5.0
    collector.controller.refreshed.wait(10)  # the timed-out calls are counted as failures
    s = collected(collector)
    failures = "lockstep_slurm_controller_failures_total"
    assert s[(failures, frozenset({("command", "scontrol show job")}))] == 1
    assert s[(failures, frozenset({("command", "scontrol show node")}))] == 1
    assert "lockstep_slurm_node_info" not in {k[0] for k in s}
    assert log.exists()


@pytest.mark.real
def test_no_slurm_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    collector = SlurmCollector(
        context(
            proc=tmp_path,
            sys_=tmp_path,
            options=SlurmOptions(node_name="x"),
        )
    )
    collector.rootfs = tmp_path
    with pytest.raises(NothingHere, match="no Slurm here"):
        list(collector.collect())


def test_gres_conf_order_and_ranges() -> None:
    text = (
        "# GPUs wired in PCI order, not device order\n"
        "AutoDetect=off\n"
        "NodeName=node[01-08] Name=gpu File=/dev/nvidia[2,0]\n"
        "NodeName=node07 Name=gpu File=/dev/nvidia3\n"
        "NodeName=node09 Name=gpu File=/dev/nvidia9\n"
        "Name=gpu File=/dev/nvidia1\n"
        "Name=mps Count=100\n"
    )
    assert parse_gres_conf(text, "node07") == ["/dev/nvidia2", "/dev/nvidia0", "/dev/nvidia3", "/dev/nvidia1"]
    assert expand_brackets("n[01-03,10]") == ["n01", "n02", "n03", "n10"]


def slurm_node_root(tmp_path: Path) -> Path:
    """A root filesystem with a slurm.conf: a Slurm node, whatever this machine is."""
    (tmp_path / "root" / "etc" / "slurm").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "slurm" / "slurm.conf").write_text("ClusterName=test\n")
    return tmp_path / "root"


def test_no_slurm_and_no_job_cgroups_is_nothing_here_without_asking_slurmd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scontrol listpids` is a process started every round: on a node with no Slurm (no
    slurm.conf, no slurmd) it is not asked."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    calls: list[list[str]] = []

    def scontrol(args: list[str], timeout: float) -> str:
        calls.append(args)
        return (SLURM / "scontrol-listpids.txt").read_text()

    collector = SlurmCollector(
        dataclasses.replace(
            context(proc=SLURM / "nocgroup" / "proc", sys_=SLURM / "nocgroup" / "sys"),
            options=SlurmOptions(node_name="node07"),
            seams=Seams(SCONTROL.replaced_by(scontrol)),
        )
    )
    collector.rootfs = tmp_path
    with pytest.raises(NothingHere, match="no Slurm here"):
        list(collector.collect())
    assert calls == []
    collector.rootfs = slurm_node_root(tmp_path)  # the same node with Slurm configured
    assert collected(collector)[("lockstep_slurm_job_processes", frozenset({("job_id", "501")}))] == 2
    assert calls[0] == ["listpids"]


def test_node_without_job_cgroups_asks_the_local_slurmd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """proctrack/linuxproc: no job cgroups; `scontrol listpids` (captured) names the jobs' pids."""
    calls: list[list[str]] = []

    def scontrol(args: list[str], timeout: float) -> str:
        calls.append(args)
        if args == ["listpids"]:
            return (SLURM / "scontrol-listpids.txt").read_text()
        raise OSError("no controller in this test")

    collector = SlurmCollector(
        dataclasses.replace(
            context(
                proc=SLURM / "nocgroup" / "proc",
                sys_=SLURM / "nocgroup" / "sys",
                options=SlurmOptions(node_name="node07"),
            ),
            seams=Seams(SCONTROL.replaced_by(scontrol)),
        )
    )
    collector.rootfs = slurm_node_root(tmp_path)
    s = collected(collector)
    assert s[info("501", "erin", "nlp", "gpu", "eval")] == 1
    assert s[job("lockstep_slurm_job_processes", "501")] == 2  # slurmstepd (10070) not counted
    assert calls[0] == ["listpids"]


@pytest.mark.parametrize(
    "gpus",
    ["-", "0-", "3-1", "0-4096", "0,0-4095", "0-30000000"],
    ids=["dash", "open range", "backwards", "4097 indices", "4097 in two parts", "30 million"],
)
def test_a_bad_or_huge_gpu_list_skips_that_jobs_gpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, gpus: str
) -> None:
    """Issue 29 item 10: a job's user sets SLURM_JOB_GPUS.  '-' failed the whole collector every
    round; '0-30000000' was expanded into a 30-million-entry list held for the job's life."""
    tree = tmp_path / "v2"
    shutil.copytree(SLURM / "v2", tree, symlinks=True)
    environ = tree / "proc" / "5001" / "environ"
    environ.write_bytes(environ.read_bytes().replace(b"SLURM_JOB_GPUS=0,2", b"SLURM_JOB_GPUS=" + gpus.encode()))
    collector = SlurmCollector(
        context(proc=tree / "proc", sys_=tree / "sys", options=SlurmOptions(node_name="node07"), seams=captured())
    )
    with caplog.at_level(logging.WARNING):
        collected(collector)
        s = collected(collector)
    assert s[info("101", "alice", "llm", "gpu", "pretrain 70b")] == 1  # the job itself is still reported
    assert s[job("lockstep_slurm_job_processes", "101")] == 3
    assert s[job("lockstep_slurm_job_cpu_seconds_total", "102")] == 5.0  # and the other job
    assert collector._environ_details["101"].gres_indices == ()
    assert s[("lockstep_slurm_skipped_gpu_lists_total", frozenset())] == 1  # counted once for the job
    skipped = [r for r in caplog.records if r.getMessage() == "job's GPU list skipped"]
    assert [getattr(r, "job_id", None) for r in skipped] == ["101"]  # once for the job, not per round


def test_gpu_index_lists_within_the_bound_are_expanded() -> None:
    assert expand_ranges("0-2,5") == [0, 1, 2, 5]
    assert expand_ranges("") == []
    assert len(expand_ranges(f"0-{MAX_GRES_INDICES - 1}")) == MAX_GRES_INDICES
    with pytest.raises(ValueError, match=f"names more than {MAX_GRES_INDICES} indices"):
        expand_ranges(f"0-{MAX_GRES_INDICES}")


def _scontrol_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return script


@pytest.mark.real
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
    collector.rootfs = slurm_node_root(tmp_path)
    values = collected(collector)
    assert values[("lockstep_slurm_job_processes", frozenset({("job_id", "501")}))] == 2


@pytest.mark.real
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
    wait_until(lambda: not alive(started), timeout=5, what="no scontrol left running after once")


def test_a_job_name_over_the_cap_keeps_its_job_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "v2"
    shutil.copytree(FIXTURES / "slurm" / "v2", tree, symlinks=True)
    environ = tree / "proc" / "5001" / "environ"
    name = "n" * 5000
    environ.write_bytes(
        environ.read_bytes().replace(b"SLURM_JOB_NAME=pretrain 70b", b"SLURM_JOB_NAME=" + name.encode())
    )
    collector = SlurmCollector(
        context(proc=tree / "proc", sys_=tree / "sys", options=SlurmOptions(node_name="node07"), seams=captured())
    )
    result = served(collector)
    labels = {
        "job_id": "101",
        "user": "alice",
        "account": "llm",
        "partition": "gpu",
        "job_name": safe_label_value(name),
        "array_job_id": "",
        "array_task_id": "",
    }
    for values in (result.text, result.openmetrics):
        assert of(values, "lockstep_slurm_job_info", **labels) == 1  # was absent
        assert of(values, "lockstep_slurm_job_cpu_seconds_total", job_id="101") == 123.456789
    assert self_metric(result, "altered_label_values_total", "slurm") == 1
