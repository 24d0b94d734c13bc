"""The NCCL Inspector collector on dump files written as NCCL 2.30.7 writes them
(tests/fixtures/nccl/README.md)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from lockstep.agent import cli
from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.gpus import GpuInventory, GpuProcess, PublishedGpu
from lockstep.agent.seams import MONOTONIC_CLOCK, Seams
from lockstep.collectors.nccl import InspectorCollector, InspectorOptions
from lockstep.collectors.nccl.inspector_records import BadLine, parse_line
from tests.support import FIXTURES, collected, samples

DUMPS = FIXTURES / "nccl" / "inspector"
COMM = "0x7f8c496ae9f661"


def node(tmp_path: Path, *, pids_on_gpus: dict[int, int] | None = None, cgroups: dict[int, str] | None = None) -> Paths:
    """A host root with the fixture dumps under /scratch/run, and a procfs with the writers' cgroups."""
    rootfs, procfs = tmp_path / "rootfs", tmp_path / "proc"
    shutil.copytree(DUMPS, rootfs / "scratch" / "run")
    for pid, cgroup in (cgroups or {}).items():
        (procfs / str(pid)).mkdir(parents=True)
        (procfs / str(pid) / "cgroup").write_text(cgroup)
    procfs.mkdir(exist_ok=True)
    return Paths(sysfs=tmp_path / "sys", procfs=procfs, rootfs=rootfs)


def inventory(pids_on_gpus: dict[int, int]) -> GpuInventory:
    gpus = GpuInventory()
    gpus.publish(
        tuple(
            PublishedGpu(
                index=index,
                uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
                pci_bus_id=f"00000000:{index:02X}:00.0",
                minor_number=index,
                model="NVIDIA H100 80GB HBM3",
                up=True,
                processes=tuple(
                    GpuProcess(pid, 1 << 30, None, None) for pid, gpu in pids_on_gpus.items() if gpu == index
                ),
                mig_devices=(),
            )
            for index in range(8)
        )
    )
    return gpus


def make(
    paths: Path | Paths,
    glob: str = "/scratch/run/*/*.log",
    gpus: GpuInventory | None = None,
    clock: Callable[[], float] | None = None,
    **options,
) -> InspectorCollector:  # type: ignore[no-untyped-def]
    assert isinstance(paths, Paths)
    options.setdefault("node_name", "node001")
    opts = InspectorOptions(dumps=(glob,), start_at="beginning", **options)
    seams = Seams() if clock is None else Seams(MONOTONIC_CLOCK.replaced_by(clock))
    return InspectorCollector(
        CollectorContext(paths, opts, logging.getLogger("test"), seams, gpu_inventory=gpus or GpuInventory())
    )


def series(s: dict, name: str) -> dict[tuple[str, ...], float]:
    """name's samples keyed by their label values in declaration order of the interesting ones."""
    found = {}
    for (metric, labels), v in s.items():
        if metric == name:
            d = dict(labels)
            found[(d["job_id"], d["comm"], d["rank"], d["host"], d.get("collective", d.get("operation", "")))] = v
    return found


def skipped(s: dict) -> dict[str, float]:
    return {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == "lockstep_nccl_inspector_lines_skipped_total"}


def test_collectives_p2p_and_verbose_records_become_counters_per_rank_and_operation(tmp_path: Path) -> None:
    s = collected(make(node(tmp_path)))
    rank3 = ("4242", COMM, "3", "node001")
    assert series(s, "lockstep_nccl_collectives_total")[(*rank3, "AllReduce")] == 3
    assert series(s, "lockstep_nccl_collective_seconds_total")[(*rank3, "AllReduce")] == 0.006  # 2000+2500+1500 us
    assert series(s, "lockstep_nccl_collective_bytes_total")[(*rank3, "AllReduce")] == 3 * 268435456
    # busbw (GB/s, 1e9 bytes) x exec time, summed: 234.881024e9*0.002 + 187.904819e9*0.0025 + 313.174699e9*0.0015
    assert series(s, "lockstep_nccl_collective_bus_bytes_total")[(*rank3, "AllReduce")] == pytest.approx(
        469762048 + 469762047.5 + 469762048.5, abs=0.01
    )
    # The verbose record (event_trace_sn/ts) counts like any other.
    assert series(s, "lockstep_nccl_collectives_total")[(*rank3, "ReduceScatter")] == 1
    assert series(s, "lockstep_nccl_collective_seconds_total")[(*rank3, "ReduceScatter")] == 0.041057
    # A NaN bus bandwidth ("nan") counts the collective and its time, adds no bus bytes.
    assert series(s, "lockstep_nccl_collectives_total")[(*rank3, "AllGather")] == 1
    assert series(s, "lockstep_nccl_collective_bus_bytes_total")[(*rank3, "AllGather")] == 0
    assert series(s, "lockstep_nccl_p2p_operations_total") == {(*rank3, "Send"): 1, (*rank3, "Recv"): 1}
    assert series(s, "lockstep_nccl_p2p_seconds_total") == {(*rank3, "Send"): 0.0004, (*rank3, "Recv"): 0.0005}
    assert series(s, "lockstep_nccl_p2p_bytes_total") == {(*rank3, "Send"): 33554432, (*rank3, "Recv"): 33554432}
    assert series(s, "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")] == 1
    assert skipped(s) == {"not_json": 0, "bad_record": 0, "unsupported_format": 0, "too_long": 0, "series_limit": 0}


def test_partial_last_line_is_counted_once_its_newline_arrives(tmp_path: Path) -> None:
    paths = node(tmp_path)
    collector = make(paths)
    rank3 = ("4242", COMM, "3", "node001", "AllReduce")
    assert series(collected(collector), "lockstep_nccl_collectives_total")[rank3] == 3
    dump = paths.rootfs / "scratch/run/nccl-inspector-4242/node001-pid2200.log"
    whole = open(DUMPS / "nccl-inspector-4242/node001-pid2200.log").read().split("\n")[0]  # an AllReduce line
    partial = dump.read_text().split("\n")[-1]
    with open(dump, "a") as f:
        f.write(whole[len(partial) :] + "\n")
    s = collected(collector)
    assert series(s, "lockstep_nccl_collectives_total")[rank3] == 4
    assert skipped(s)["not_json"] == 0


def test_rank_info_names_the_gpu_of_the_writing_process_and_the_communicator(tmp_path: Path) -> None:
    s = collected(make(node(tmp_path), gpus=inventory({2200: 3, 2201: 4})))
    info = {dict(k[1])["rank"]: dict(k[1]) for k, v in s.items() if k[0] == "lockstep_nccl_rank_info" and v == 1}
    assert info["3"] == {
        "job_id": "4242",
        "comm": COMM,
        "rank": "3",
        "host": "node001",
        "comm_name": "DP Group 0",
        "n_ranks": "8",
        "nnodes": "1",
        "gpu": "3",
        "uuid": "GPU-00000003-0000-0000-0000-000000000000",
        "records": "all",
    }
    assert (info["4"]["gpu"], info["4"]["comm_name"]) == ("4", "DP Group 0")


def test_job_from_the_writers_cgroup_when_the_directory_does_not_name_it(tmp_path: Path) -> None:
    paths = node(tmp_path, cgroups={2300: "0::/system.slice/slurmstepd.scope/job_5151/step_0/user/task_0\n"})
    s = collected(make(paths))
    assert series(s, "lockstep_nccl_collectives_total")[("5151", "0x1c2d3e4f5a6b7c", "0", "node001", "Broadcast")] == 1


def test_job_unknown_when_the_writer_is_on_another_node(tmp_path: Path) -> None:
    paths = node(tmp_path)
    s = collected(make(paths, node_name="node002"))
    assert (
        series(s, "lockstep_nccl_collectives_total")[("unknown", "0x1c2d3e4f5a6b7c", "0", "node001", "Broadcast")] == 1
    )


def test_garbage_and_other_format_versions_are_counted_and_skipped(tmp_path: Path) -> None:
    paths = node(tmp_path)
    good = (DUMPS / "nccl-inspector-4242/node001-pid2201.log").read_text().strip()
    record = json.loads(good)
    v5 = json.loads(good)
    v5["metadata"]["inspector_output_format_version"] = "v5.0"
    negative = json.loads(good)
    negative["coll_perf"]["coll_exec_time_us"] = -1
    text_rank = json.loads(good)
    text_rank["header"]["rank"] = "4"
    dump = paths.rootfs / "scratch/run/nccl-inspector-4242/node001-pid9999.log"
    dump.write_text(
        "\n".join(
            [
                "not json",
                "[1, 2]",
                json.dumps(v5),
                json.dumps(negative),
                json.dumps(text_rank),
                "\xff\xfe",
                json.dumps(record),
            ]
        )
        + "\n"
    )
    s = collected(make(paths))
    assert skipped(s) == {"not_json": 3, "bad_record": 2, "unsupported_format": 1, "too_long": 0, "series_limit": 0}
    assert series(s, "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")] == 2


def test_series_are_bounded_and_the_excess_counted(tmp_path: Path) -> None:
    s = collected(make(node(tmp_path), max_series=3))
    assert len(series(s, "lockstep_nccl_collectives_total")) + len(series(s, "lockstep_nccl_p2p_operations_total")) == 3
    assert skipped(s)["series_limit"] == 4  # Send, Recv, rank 4's AllReduce, job 5151's Broadcast


def test_truncated_dump_of_a_reused_pid_is_read_from_its_start(tmp_path: Path) -> None:
    paths = node(tmp_path)
    collector = make(paths)
    dump = paths.rootfs / "scratch/run/nccl-inspector-4242/node001-pid2201.log"
    line = dump.read_text()
    dump.write_text(line * 2)
    assert (
        series(collected(collector), "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")]
        == 2
    )
    dump.write_text(line)  # NCCL opens its file with "w": a new process with the same pid truncates it
    s = collected(collector)
    assert series(s, "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")] == 3


def test_a_dump_file_appearing_whole_is_read_and_idle_ranks_go(tmp_path: Path) -> None:
    paths = node(tmp_path)
    now = [1000.0]
    collector = make(paths, glob="/scratch/run/teardown/*.log", idle_timeout=600.0, clock=lambda: now[0])
    (paths.rootfs / "scratch/run/teardown").mkdir()
    assert series(collected(collector), "lockstep_nccl_collectives_total") == {}
    # A file appears whole (the plugin's first periodic dump; it never writes at teardown).
    shutil.copy(
        DUMPS / "nccl-inspector-4242/node001-pid2201.log",
        paths.rootfs / "scratch/run/teardown/node001-pid2201.log",
    )
    assert series(collected(collector), "lockstep_nccl_collectives_total") == {
        ("unknown", COMM, "4", "node001", "AllReduce"): 1
    }
    now[0] += 600.0
    assert series(collected(collector), "lockstep_nccl_collectives_total") == {}


def test_rotation_by_rename_reads_the_rest_and_the_new_file(tmp_path: Path) -> None:
    paths = node(tmp_path)
    collector = make(paths, glob="/scratch/run/nccl-inspector-4242/node001-pid2201.log*")
    collected(collector)
    dump = paths.rootfs / "scratch/run/nccl-inspector-4242/node001-pid2201.log"
    line = dump.read_text()
    with open(dump, "a") as f:
        f.write(line)
    os.rename(dump, str(dump) + ".1")
    dump.write_text(line)
    s = collected(collector)
    assert series(s, "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")] == 3


def test_no_globs_is_nothing_here(tmp_path: Path) -> None:
    collector = InspectorCollector(CollectorContext(node(tmp_path), InspectorOptions(), logging.getLogger("test")))
    with pytest.raises(NothingHere, match="--nccl-inspector.dumps"):
        list(collector.collect())


@pytest.mark.parametrize(
    "path",
    [
        ("header", "id"),
        ("header", "rank"),
        ("metadata", "inspector_output_format_version"),
        ("metadata", "hostname"),
        ("metadata", "pid"),
        ("coll_perf", "coll"),
        ("coll_perf", "coll_sn"),
        ("coll_perf", "coll_exec_time_us"),
        ("coll_perf", "coll_msg_size_bytes"),
        ("coll_perf", "coll_busbw_gbs"),
        ("", "coll_perf"),
    ],
)
def test_a_renamed_field_is_a_bad_record(path: tuple[str, str]) -> None:
    """The field names are NCCL's: a reader that guessed one would pass every other test."""
    record = json.loads((DUMPS / "nccl-inspector-4242/node001-pid2201.log").read_text())
    section, key = path
    parent = record[section] if section else record
    parent[f"{key}_renamed"] = parent.pop(key)
    with pytest.raises(BadLine) as raised:
        parse_line(json.dumps(record).encode())
    assert raised.value.reason == "bad_record"


def test_a_backlog_is_read_within_the_bytes_per_round_over_several_rounds(tmp_path: Path) -> None:
    paths = node(tmp_path)
    glob = "/scratch/run/nccl-inspector-4242/node001-pid2201.log"
    dump = paths.rootfs / glob.lstrip("/")
    line = dump.read_text()
    dump.write_text(line * 10)  # 10 records of 457 bytes
    collector = make(paths, glob=glob, max_bytes_per_round=1000)
    totals = [
        series(collected(collector), "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")]
    ]
    for _ in range(4):
        totals.append(
            series(collected(collector), "lockstep_nccl_collectives_total")[("4242", COMM, "4", "node001", "AllReduce")]
        )
    assert len(line) == 482
    assert totals == [2, 4, 6, 8, 10]  # 1000 bytes a round: the lines complete in each


def test_a_communicator_name_up_to_255_characters_is_read(tmp_path: Path) -> None:
    """The plugin writes names of up to 255 bytes (NVIDIA/nccl v2.30.7-1,
    plugins/profiler/inspector/inspector.h: ``char commNameStr[NCCL_COMM_NAME_MAX]``, 256, filled
    by snprintf in inspector.cc inspectorFillCommInfo); 128 used to make every record of such a
    communicator a bad_record."""
    paths = node(tmp_path)
    record = json.loads((DUMPS / "nccl-inspector-4242/node001-pid2201.log").read_text())
    name = "pipeline-stage-3/" + "x" * 238
    assert len(name) == 255
    record["header"]["comm_name"] = name
    dump = paths.rootfs / "scratch/run/long-name/node001-pid2201.log"
    dump.parent.mkdir()
    dump.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    s = collected(make(paths, glob="/scratch/run/long-name/*.log"))
    assert skipped(s)["bad_record"] == 0
    info = [dict(k[1]) for k, v in s.items() if k[0] == "lockstep_nccl_rank_info"]
    assert [i["comm_name"] for i in info] == [name]
    record["header"]["comm_name"] = name + "x"  # longer than the plugin ever writes: garbage
    with pytest.raises(BadLine) as raised:
        parse_line(json.dumps(record).encode())
    assert raised.value.reason == "bad_record"


SAMPLED = FIXTURES / "nccl" / "inspector-2.28.3"
SAMPLED_RANK = ("4343", "0x3e1f0a9b8c7d6e", "0", "node001", "AllReduce")


def sampled_node(tmp_path: Path) -> Paths:
    rootfs = tmp_path / "rootfs"
    shutil.copytree(SAMPLED, rootfs / "scratch" / "run")
    (tmp_path / "proc").mkdir()
    return Paths(sysfs=tmp_path / "sys", procfs=tmp_path / "proc", rootfs=rootfs)


def test_a_pre_2_30_3_dump_is_samples_counted_by_coll_sn_and_timed_by_the_samples(tmp_path: Path) -> None:
    """NCCL 2.28.3's plugin writes, at each dump, only each communicator's latest collective
    (v2.28.3-1 ext-profiler/inspector/inspector.cc inspectorCommInfoDump) and no comm_name
    (tests/fixtures/nccl/README.md): 21 AllReduce ran (coll_sn 0-20), three dumps wrote
    coll_sn 6, 13 and 20.  Counted as records they were 3 collectives."""
    s = collected(make(sampled_node(tmp_path)))
    assert series(s, "lockstep_nccl_collectives_total")[SAMPLED_RANK] == 21
    # Each sample stands for the 7 collectives since the previous one: 7 x (1200 + 1300 + 1100) us.
    assert series(s, "lockstep_nccl_collective_seconds_total")[SAMPLED_RANK] == 0.0252
    assert series(s, "lockstep_nccl_collective_bytes_total")[SAMPLED_RANK] == 21 * 67108864
    # 7 x (55.924053e9 x 0.0012 + 51.622203e9 x 0.0013 + 61.008058e9 x 0.0011) bytes
    assert series(s, "lockstep_nccl_collective_bus_bytes_total")[SAMPLED_RANK] == pytest.approx(
        7 * 3 * 67108864, rel=1e-6
    )
    info = [dict(k[1]) for k, v in s.items() if k[0] == "lockstep_nccl_rank_info"]
    assert [(i["comm_name"], i["records"]) for i in info] == [("unknown", "sampled")]
    assert skipped(s)["bad_record"] == 0


def test_later_samples_add_the_coll_sn_advance_and_a_sample_read_twice_adds_nothing(tmp_path: Path) -> None:
    paths = sampled_node(tmp_path)
    collector = make(paths)
    assert series(collected(collector), "lockstep_nccl_collectives_total")[SAMPLED_RANK] == 21
    dump = paths.rootfs / "scratch/run/nccl-inspector-4343/node001-pid3300.log"
    last = json.loads(dump.read_text().splitlines()[-1])
    with open(dump, "a") as f:
        f.write(json.dumps(last, separators=(",", ":")) + "\n")  # the same sample again
        last["coll_perf"]["coll_sn"] = 29  # 9 more since the last dump
        last["coll_perf"]["coll_exec_time_us"] = 2000
        f.write(json.dumps(last, separators=(",", ":")) + "\n")
    s = collected(collector)
    assert series(s, "lockstep_nccl_collectives_total")[SAMPLED_RANK] == 30
    assert series(s, "lockstep_nccl_collective_seconds_total")[SAMPLED_RANK] == 0.0252 + 0.018


def test_once_reads_the_dump_files_of_a_directory_glob_from_their_start(tmp_path: Path) -> None:
    """`lockstep once --nccl-inspector.dumps DIR_GLOB` read nothing: the directory was taken for
    a file that is not regular, and the files present were read from their end with no flag to
    say otherwise.  A matched directory stands for its <host>-pid<pid>.log files (the plugin's
    names, inspector.cc inspectorStateDumpJSON)."""
    paths = sampled_node(tmp_path)
    argv = ["once", "--collector.disable-defaults", "--collector.nccl_inspector", "--path.rootfs", str(paths.rootfs)]
    argv += ["--nccl-inspector.dumps", "/scratch/run/nccl-inspector-*", "--nccl-inspector.start-at", "beginning"]
    body, failures = cli.once(argv)
    assert failures == []
    assert series(samples(body.decode()), "lockstep_nccl_collectives_total") == {SAMPLED_RANK: 21}


def test_check_says_how_many_dump_files_there_are_and_why_none(tmp_path: Path) -> None:
    paths = node(tmp_path)
    assert make(paths).check() == "3 Inspector dump file(s) match /scratch/run/*/*.log"
    (paths.rootfs / "scratch/run/empty").mkdir()
    root = paths.rootfs
    assert make(paths, glob="/scratch/run/nothing-*").check() == (
        f"0 Inspector dump files: nothing matches {root}/scratch/run/nothing-*"
    )
    assert make(paths, glob="/scratch/run/empty").check() == (
        f"0 Inspector dump files: {root}/scratch/run/empty matches directories holding no file named "
        f"*-pid*.log: 1 directory ({root}/scratch/run/empty)"
    )
