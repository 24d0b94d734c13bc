"""Host collector on a captured procfs tree, with exact values."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from lockstep.collectors.host import HostCollector
from tests.support import FIXTURES, collected, context

PROC = FIXTURES / "host" / "proc"


def collect(proc: Path) -> dict:
    return collected(HostCollector(context(proc=proc)))


def test_values_from_captured_proc() -> None:
    s = collect(PROC)
    # /proc/stat "cpu  2262 0 1425 70349 211 0 42 8 0 0" in USER_HZ (100) ticks
    assert s[("lockstep_host_cpu_seconds_total", frozenset({("mode", "user")}))] == 22.62
    assert s[("lockstep_host_cpu_seconds_total", frozenset({("mode", "idle")}))] == 703.49
    assert s[("lockstep_host_cpu_seconds_total", frozenset({("mode", "steal")}))] == 0.08
    assert s[("lockstep_host_cpus", frozenset())] == 2
    assert s[("lockstep_host_context_switches_total", frozenset())] == 243568
    assert s[("lockstep_host_boot_time_seconds", frozenset())] == 1795302171
    assert s[("lockstep_host_processes_running", frozenset())] == 1
    # meminfo kB -> bytes
    assert s[("lockstep_host_memory_total_bytes", frozenset())] == 24684092 * 1024
    assert s[("lockstep_host_memory_available_bytes", frozenset())] == 24364356 * 1024
    assert s[("lockstep_host_memory_dirty_bytes", frozenset())] == 1208 * 1024
    assert s[("lockstep_host_swap_total_bytes", frozenset())] == 0
    assert s[("lockstep_host_load5", frozenset())] == float((PROC / "loadavg").read_text().split()[1])
    # PSI totals are microseconds
    pressure = "lockstep_host_pressure_stalled_seconds_total"
    assert s[(pressure, frozenset({("resource", "cpu"), ("kind", "some")}))] == 4.193085
    assert s[(pressure, frozenset({("resource", "io"), ("kind", "full")}))] == 1.376298
    assert s[(pressure, frozenset({("resource", "memory"), ("kind", "some")}))] == 0
    # Threads 300/301 and 88 are in D; 77's command name "evil ) D (x" is not a state.
    assert s[("lockstep_host_processes_blocked", frozenset())] == 2


def test_kernel_without_psi_omits_pressure_only(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    shutil.rmtree(proc / "pressure")
    s = collect(proc)
    assert not [key for key in s if key[0].startswith("lockstep_host_pressure")]
    assert s[("lockstep_host_cpus", frozenset())] == 2
    note = HostCollector(context(proc=proc)).check()
    assert note.startswith(f"no {proc}/pressure/cpu,memory,io")


def test_missing_proc_is_a_failure_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        collect(tmp_path)
    assert err.value.filename == str(tmp_path / "stat")


def test_a_value_the_kernel_never_writes_loses_that_sample_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29 item 15: one non-numeric /proc/stat field failed the whole collector every round."""
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc)
    stat = (proc / "stat").read_text()
    stat = stat.replace("cpu  2262 0 1425", "cpu  2262 x 1425").replace("ctxt 243568", "ctxt 24356a")
    (proc / "stat").write_text(stat)
    meminfo = (proc / "meminfo").read_text()
    (proc / "meminfo").write_text(meminfo.replace("Dirty:", "Dirty: junk kB\nDirtyWas:", 1))
    collector = HostCollector(context(proc=proc))
    with caplog.at_level(logging.WARNING):
        collected(collector)
        s = collected(collector)
    # Logged once, not once per round.
    assert [r.getMessage() for r in caplog.records] == [
        "skipped values the kernel never writes: stat: cpu nice; stat: ctxt; meminfo: Dirty"
    ]
    # Counted, per round: 2 rounds of two /proc/stat values and one meminfo value.
    skipped = {
        dict(labels)["source"]: v for (name, labels), v in s.items() if name == "lockstep_host_skipped_values_total"
    }
    assert skipped == {"stat": 4, "meminfo": 2, "loadavg": 0, "pressure": 0}
    cpu = "lockstep_host_cpu_seconds_total"
    assert ("lockstep_host_cpu_seconds_total", frozenset({("mode", "nice")})) not in s
    assert ("lockstep_host_context_switches_total", frozenset()) not in s
    assert ("lockstep_host_memory_dirty_bytes", frozenset()) not in s
    # Everything else from the same files is still there, with its exact value.
    assert s[(cpu, frozenset({("mode", "user")}))] == 22.62
    assert s[(cpu, frozenset({("mode", "system")}))] == 14.25
    assert s[(cpu, frozenset({("mode", "steal")}))] == 0.08
    assert s[("lockstep_host_cpus", frozenset())] == 2
    assert s[("lockstep_host_boot_time_seconds", frozenset())] == 1795302171
    assert s[("lockstep_host_processes_running", frozenset())] == 1
    assert s[("lockstep_host_memory_total_bytes", frozenset())] == 24684092 * 1024
    assert s[("lockstep_host_processes_blocked", frozenset())] == 2
