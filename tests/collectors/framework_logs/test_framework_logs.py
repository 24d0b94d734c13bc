"""The framework_logs collector on real files: the frameworks' captured lines (tests/fixtures/
framework_logs) in Slurm-named files, in jobs' StdOut found through scontrol, and in
containers' CRI logs found through the GPUs' processes; growth, rotation, truncation, garbage
and bounds, with exact values."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.gpus import GpuInventory, GpuProcess, PublishedGpu
from lockstep.agent.seams import MONOTONIC_CLOCK, WALL_CLOCK, Seams
from lockstep.collectors.framework_logs import FrameworkLogsCollector, FrameworkLogsOptions
from lockstep.collectors.toolkit.scontrol import SCONTROL
from tests.support import FIXTURES, collected, procfs, wait_until

LOGS = FIXTURES / "framework_logs"
NOW = 1_787_400_000.0
# A real `scontrol -o show job` record (tests/fixtures/slurm/scontrol-show-job-gres.txt, from
# slurm-wlm on Debian), its output files set as a batch script's would be.
REAL_JOB = (FIXTURES / "slurm" / "scontrol-show-job-gres.txt").read_text().splitlines()[0]


def job_record(job: str, batch_host: str, stdout: str, stderr: str, uid: int | None = None) -> str:
    """The job's record; its user the one who runs the tests (who writes the files) unless ``uid``."""
    user = f"UserId=user({os.getuid() if uid is None else uid}) "
    record = REAL_JOB.replace("JobId=2 ", f"JobId={job} ").replace("BatchHost=vm ", f"BatchHost={batch_host} ")
    record = record.replace("UserId=lockstep-bob(1002) ", user)
    return record.replace("StdErr=/dev/null", f"StdErr={stderr}").replace("StdOut=/dev/null", f"StdOut={stdout}") + "\n"


class World:
    """A host root with /proc, and the collector built on it with a clock of its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.proc = tmp_path / "proc"
        self.proc.mkdir()
        self.now = [0.0]
        self.wall = [NOW]
        self.inventory = GpuInventory()
        self.answers: dict[str, str] = {}
        self.calls: list[str] = []

    def scontrol(self, args: list[str], timeout: float) -> str:
        self.calls.append(" ".join(args))
        if args[:3] == ["-o", "show", "job"] and args[3] in self.answers:
            return self.answers[args[3]]
        raise OSError(f"scontrol: no answer for {args}")

    def process(self, pid: int, cgroup: str) -> None:
        procfs.stat(self.proc, pid)
        (self.proc / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")

    def file(self, host_path: str, text: str | bytes = "") -> Path:
        path = self.root / host_path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path

    def collector(self, **options: object) -> FrameworkLogsCollector:
        defaults: dict[str, object] = {"start_at": "beginning", "slurm": False, "pods": False, "node_name": "vm"}
        seams = Seams(
            MONOTONIC_CLOCK.replaced_by(lambda: self.now[0]),
            WALL_CLOCK.replaced_by(lambda: self.wall[0]),
            SCONTROL.replaced_by(self.scontrol),
        )
        context = CollectorContext(
            Paths(sysfs=self.root / "sys", procfs=self.proc, rootfs=self.root),
            FrameworkLogsOptions(**{**defaults, **options}),  # type: ignore[arg-type]
            logging.getLogger("test"),
            seams=seams,
            gpu_inventory=self.inventory,
        )
        return FrameworkLogsCollector(context)


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def job(s: Samples, name: str, job_id: str, framework: str) -> float:
    return s[(f"lockstep_framework_{name}", frozenset({"job_id": job_id, "framework": framework}.items()))]


def jobs(s: Samples) -> list[tuple[str, str]]:
    return sorted(
        (dict(k[1])["job_id"], dict(k[1])["framework"]) for k in s if k[0] == "lockstep_framework_iterations_total"
    )


def by(s: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(k[1])[label]: v for k, v in s.items() if k[0] == f"lockstep_framework_{name}"}


def fixture(name: str) -> str:
    return (LOGS / f"{name}.log").read_text()


def run(collector: FrameworkLogsCollector) -> Samples:
    return collected(collector)


def test_each_frameworks_lines_in_slurm_named_files(world: World) -> None:
    world.file("/scratch/a/slurm-100.out", fixture("megatron"))
    world.file("/scratch/a/slurm-101.out", fixture("nemo"))
    world.file("/scratch/b/slurm-77_3.out", fixture("torchtitan"))
    collector = world.collector(paths=("/scratch/*/slurm-*.out",))
    s = run(collector)
    collector.close()
    assert jobs(s) == [("100", "megatron"), ("101", "nemo"), ("77_3", "torchtitan")]
    # Megatron: from iteration 1 to 500; 99 x 1.8349 + 100 x (1.8356 + 1.8342 + 1.8349 + 1.8356) s.
    assert job(s, "iterations_total", "100", "megatron") == 499
    assert job(s, "iteration_seconds_total", "100", "megatron") == 915.6851
    assert job(s, "iteration_duration_seconds", "100", "megatron") == 1.8356
    assert job(s, "samples_total", "100", "megatron") == 512 * 499
    assert job(s, "checkpoint_saves_total", "100", "megatron") == 2
    assert job(s, "checkpoint_save_seconds_total", "100", "megatron") == 83.0  # 2 x 41.5 s between its lines
    assert job(s, "checkpoint_save_in_progress", "100", "megatron") == 0
    assert by(s, "straggler_iteration_seconds", "extreme") == {"fastest": 1.80122, "slowest": 2.2109}
    assert by(s, "straggler_rank", "extreme") == {"fastest": 5, "slowest": 12}
    # NeMo: iterations 0 to 29, 25 x 0.189 + 4 x 0.19 s, 32 samples each, one save of 12.345 s.
    assert job(s, "iterations_total", "101", "nemo") == 29
    assert job(s, "iteration_seconds_total", "101", "nemo") == 5.485
    assert job(s, "samples_total", "101", "nemo") == 928
    assert job(s, "checkpoint_saves_total", "101", "nemo") == 1
    assert job(s, "checkpoint_save_seconds_total", "101", "nemo") == 12.345
    # torchtitan: steps 1 to 100 by its timestamps: 49 x 2.1 + 50 x 3.15 s + the 12.34 s save at step 50
    # (between two step lines, as the framework's own time per step has it).
    assert job(s, "iterations_total", "77_3", "torchtitan") == 99
    assert job(s, "iteration_seconds_total", "77_3", "torchtitan") == 272.74
    assert job(s, "iteration_duration_seconds", "77_3", "torchtitan") == 3.15
    assert job(s, "checkpoint_save_seconds_total", "77_3", "torchtitan") == 12.34
    # Lines without their own clock are stamped when read.
    assert job(s, "last_iteration_timestamp_seconds", "101", "nemo") == NOW
    assert by(s, "log_lines_matched_total", "framework") == {"megatron": 15, "nemo": 31, "torchtitan": 12}
    assert by(s, "log_files", "source") == {"paths": 3, "slurm": 0, "pods": 0}
    sizes = sum(len(fixture(name).encode()) for name in ("megatron", "nemo", "torchtitan"))
    assert s[("lockstep_framework_log_read_bytes_total", frozenset())] == sizes
    assert set(by(s, "log_lines_invalid_total", "reason").values()) == {0}


def test_output_through_a_terminal_and_under_tqdm_bars_counts_as_plain_output(world: World) -> None:
    """Issue 46: \\r\\n endings lost NeMo's and torchtitan's saves; a tqdm bar on the stream lost
    every NeMo and Megatron step, without a count.  tqdm's own output (tests/fixtures/framework_logs/tqdm)."""
    captures = LOGS / "tqdm"
    world.file("/scratch/slurm-100.out", (captures / "megatron-tqdm-print.out").read_bytes())
    world.file("/scratch/slurm-101.out", (captures / "pty-nemo-tqdm-write.out").read_bytes())
    world.file("/scratch/slurm-102.out", (captures / "nemo-tqdm-print.out").read_bytes())
    world.file("/scratch/slurm-103.out", (captures / "pty-torchtitan.out").read_bytes())
    collector = world.collector(paths=("/scratch/slurm-*.out",))
    s = run(collector)
    collector.close()
    # The plain captures' values (test_each_frameworks_lines_in_slurm_named_files).
    assert job(s, "iterations_total", "100", "megatron") == 499
    assert job(s, "checkpoint_saves_total", "100", "megatron") == 2
    for nemo in ("101", "102"):
        assert job(s, "iterations_total", nemo, "nemo") == 29
        assert job(s, "iteration_seconds_total", nemo, "nemo") == 5.485
        assert job(s, "checkpoint_saves_total", nemo, "nemo") == 1
        assert job(s, "checkpoint_save_seconds_total", nemo, "nemo") == 12.345
    assert job(s, "iterations_total", "103", "torchtitan") == 99
    assert job(s, "checkpoint_saves_total", "103", "torchtitan") == 1
    assert job(s, "checkpoint_save_seconds_total", "103", "torchtitan") == 12.34
    assert set(by(s, "log_lines_invalid_total", "reason").values()) == {0}


def test_only_numbers_leave_the_agent_never_line_text(world: World) -> None:
    secret = "hf_SECRETTOKEN123"
    text = fixture("megatron").replace("/lustre/ckpt/llama-70b", f"/lustre/{secret}")
    world.file("/scratch/slurm-5.out", f"export HF_TOKEN={secret}\n{text}")
    collector = world.collector(paths=("/scratch/slurm-*.out",))
    s = run(collector)
    collector.close()
    labels = {value for key in s for _, value in key[1]}
    assert labels == {"5", "megatron", "fastest", "slowest", "paths", "slurm", "pods"} | {
        "bad_value",
        "no_job",
        "too_long",
        "bad_cri",
        "too_many_jobs",
    }


def test_growth_from_the_end_rotation_and_truncation_count_each_report_once(world: World) -> None:
    lines = fixture("megatron").splitlines(keepends=True)
    iterations = [line for line in lines if "elapsed time per iteration" in line]
    path = world.file("/scratch/slurm-9.out", iterations[0] + iterations[1])
    collector = world.collector(paths=("/scratch/slurm-*.out",), start_at="end")
    s = run(collector)
    assert jobs(s) == []  # history before the agent started is not counted
    with open(path, "a") as out:
        out.write(iterations[2])
    s = run(collector)
    assert job(s, "iterations_total", "9", "megatron") == 0  # where counting starts
    with open(path, "a") as out:
        out.write(iterations[3])
    assert job(run(collector), "iterations_total", "9", "megatron") == 100
    path.rename(path.with_name("slurm-9.out.1"))  # logrotate: the rest of the old file, then the new
    world.file("/scratch/slurm-9.out", iterations[4])
    s = run(collector)
    assert job(s, "iterations_total", "9", "megatron") == 200
    assert job(s, "iteration_seconds_total", "9", "megatron") == round(100 * 1.8342 + 100 * 1.8349, 6)
    path.write_text("")  # copytruncate: emptied in place, then written on
    run(collector)
    with open(path, "a") as out:
        out.write(iterations[5])
    s = run(collector)
    collector.close()
    assert job(s, "iterations_total", "9", "megatron") == 300


def test_several_ranks_printing_count_once_the_lowest_speaks(world: World) -> None:
    steps = [line for line in fixture("torchtitan").splitlines() if "step:" in line]
    text = "".join(f"[rank1]:{line}\n[rank0]:{line}\n" for line in steps[:3])
    world.file("/scratch/slurm-3.out", text)
    collector = world.collector(paths=("/scratch/slurm-*.out",))
    s = run(collector)
    collector.close()
    # rank 1 spoke first (step 1), rank 0 took over at its step 1: counting from there, 1 -> 20,
    # by the lines' timestamps 10:00:02,099 -> 10:00:42,000 (the logging module's milliseconds).
    assert job(s, "iterations_total", "3", "torchtitan") == 19
    assert job(s, "iteration_seconds_total", "3", "torchtitan") == 39.901


def test_slurm_jobs_output_found_through_scontrol_on_their_batch_host_only(world: World) -> None:
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.process(4002, "/system.slice/slurmstepd.scope/job_4243/step_0/user/task_0")
    world.process(4003, "/system.slice/slurmstepd.scope/job_4244/step_0/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/home/alice/run/out-4242.txt", "/home/alice/run/err-4242.txt")
    world.answers["4243"] = job_record("4243", "node002", "/home/bob/out.txt", "/home/bob/out.txt")
    world.file("/home/alice/run/out-4242.txt", fixture("nemo"))
    world.file("/home/alice/run/err-4242.txt", "Traceback? no: warnings only\n")
    world.file("/home/bob/out.txt", fixture("nemo"))
    collector = world.collector(slurm=True)
    s = run(collector)
    assert jobs(s) == [("4242", "nemo")]
    assert job(s, "iterations_total", "4242", "nemo") == 29
    assert by(s, "log_files", "source") == {"paths": 0, "slurm": 2, "pods": 0}
    assert s[("lockstep_framework_discovery_failures_total", frozenset())] == 1  # job 4244: no answer
    assert sorted(world.calls) == ["-o show job 4242", "-o show job 4243", "-o show job 4244"]
    world.now[0] += 30
    run(collector)
    assert len(world.calls) == 3  # asked once per job, not every round
    world.now[0] += 60
    run(collector)
    collector.close()
    assert world.calls[3:] == ["-o show job 4244"]  # the failed one is asked again at the next discovery


def test_a_quiet_job_is_kept_while_it_runs_here_and_dropped_after_it_ends(world: World) -> None:
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    world.file("/out/4242.out", fixture("nemo"))
    world.file("/scratch/slurm-17.out", fixture("nemo"))
    collector = world.collector(slurm=True, paths=("/scratch/slurm-*.out",), idle_timeout=600.0)
    assert jobs(run(collector)) == [("17", "nemo"), ("4242", "nemo")]
    world.now[0] += 900  # both silent for 15 minutes: a hung job looks like this
    s = run(collector)
    assert jobs(s) == [("4242", "nemo")]  # 17 runs nowhere here: ended; 4242's process is here
    assert job(s, "last_iteration_timestamp_seconds", "4242", "nemo") == NOW  # the stall shows
    shutil.rmtree(world.proc / "4001")
    world.now[0] += 60
    s = run(collector)
    collector.close()
    assert jobs(s) == []


POD_UID = "8f2c1b7e-3d4a-4c5b-9e6f-0a1b2c3d4e5f"


def cri(lines: list[str], start: float = 0.0) -> str:
    out = []
    for i, line in enumerate(lines):
        seconds = 1_787_306_400 + start + i
        stamp = f"2026-08-21T10:{int(seconds - 1_787_306_400) // 60:02d}:{int(seconds) % 60:02d}.123456789Z"
        if len(line) > 40:  # the runtime splits long lines: P pieces, then the F end
            out.append(f"{stamp} stdout P {line[:40]}")
            line = line[40:]
        out.append(f"{stamp} stdout F {line}")
    return "".join(f"{line}\n" for line in out)


def test_gpu_pods_container_logs_in_the_cri_format(world: World) -> None:
    world.process(
        5001,
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-abc.scope",
    )
    world.inventory.publish(
        (PublishedGpu(0, "GPU-0", "0000:01:00.0", 0, "H100", True, (GpuProcess(5001, 1 << 30, None, None),), ()),)
    )
    nemo = [line for line in fixture("nemo").splitlines()][:5]
    world.file(f"/var/log/pods/team-a_llama-0_{POD_UID}/trainer/0.log", cri(nemo))
    world.file("/var/log/pods/team-b_other-0_11111111-2222-3333-4444-555555555555/x/0.log", cri(nemo))
    collector = world.collector(pods=True)
    s = run(collector)
    collector.close()
    assert jobs(s) == [("team-a/llama-0", "nemo")]
    assert job(s, "iterations_total", "team-a/llama-0", "nemo") == 4
    # The line's own CRI time, not the time it was read: 2026-08-21T10:00:04.123456Z.
    assert job(s, "last_iteration_timestamp_seconds", "team-a/llama-0", "nemo") == 1_787_306_404.123456
    assert by(s, "log_files", "source") == {"paths": 0, "slurm": 0, "pods": 1}


def test_garbage_is_counted_by_reason_and_costs_nothing_else(world: World) -> None:
    good = fixture("nemo")
    bad = (
        "Training epoch 0, iteration 40/99 | train_step_timing in s: nan | consumed_samples: 1\n"
        + "x" * (70 * 1024)
        + "\n\x00\xff\xfe binary \x1b[99;99;99m\n"
    )
    world.file("/scratch/slurm-1.out", good + bad)
    world.file("/scratch/unnamed.out", good)
    world.file("/var/log/containers/x.log", "not a cri line\n")
    collector = world.collector(paths=("/scratch/*.out", "/var/log/containers/*.log"))
    s = run(collector)
    collector.close()
    assert jobs(s) == [("1", "nemo")]
    assert job(s, "iterations_total", "1", "nemo") == 29
    assert by(s, "log_lines_invalid_total", "reason") == {
        "bad_value": 1,
        "no_job": 31,  # every NeMo line of the file no job is known for
        "too_long": 1,
        "bad_cri": 1,
        "too_many_jobs": 0,
    }


def test_jobs_beyond_max_jobs_are_refused_and_counted(world: World) -> None:
    for job_id in (1, 2, 3):
        world.file(f"/scratch/slurm-{job_id}.out", fixture("nemo"))
    collector = world.collector(paths=("/scratch/slurm-*.out",), max_jobs=2)
    s = run(collector)
    collector.close()
    assert jobs(s) == [("1", "nemo"), ("2", "nemo")]
    assert by(s, "log_lines_invalid_total", "reason")["too_many_jobs"] == 31


def test_bytes_read_per_round_are_bounded(world: World) -> None:
    size = len(fixture("nemo").encode())
    world.file("/scratch/slurm-1.out", fixture("nemo") * 4)
    collector = world.collector(paths=("/scratch/slurm-*.out",), round_bytes=size)
    read = [run(collector)[("lockstep_framework_log_read_bytes_total", frozenset())] for _ in range(5)]
    s = run(collector)
    collector.close()
    assert [later - earlier for earlier, later in zip([0.0, *read], read)] == [size, size, size, size, 0]
    # Four copies of iterations 0-29: each copy's 0 after 29 starts counting again.
    assert job(s, "iterations_total", "1", "nemo") == 4 * 29


def test_nothing_configured_or_found_is_nothing_here(world: World) -> None:
    collector = world.collector(slurm=True, pods=True)
    with pytest.raises(NothingHere):
        run(collector)
    collector.close()


def test_history_of_a_stalled_job_is_stamped_with_its_files_last_change(world: World) -> None:
    """A job that stopped printing 12 minutes ago, whose output the agent reads only now (a new
    agent, a job found late): its last report is when its file last changed, not now."""
    path = world.file("/scratch/slurm-8.out", fixture("nemo"))
    os.utime(path, (NOW - 720, NOW - 720))
    collector = world.collector(paths=("/scratch/slurm-*.out",))
    s = run(collector)
    collector.close()
    assert job(s, "last_iteration_timestamp_seconds", "8", "nemo") == NOW - 720


def test_configured_container_logs_name_their_pod(world: World) -> None:
    """A glob over /var/log/containers (the kubelet's links, <pod>_<namespace>_<container>-<id>.log)
    or /var/log/pods: the job is the pod, the lines in the CRI format."""
    nemo = fixture("nemo").splitlines()[:3]
    world.file("/var/log/containers/llama-0_team-a_trainer-0123abcd.log", cri(nemo))
    world.file(f"/var/log/pods/team-b_gpt-1_{POD_UID}/trainer/0.log", cri(nemo))
    collector = world.collector(paths=("/var/log/containers/*.log", "/var/log/pods/*/*/*.log"))
    s = run(collector)
    collector.close()
    assert jobs(s) == [("team-a/llama-0", "nemo"), ("team-b/gpt-1", "nemo")]
    assert job(s, "iterations_total", "team-b/gpt-1", "nemo") == 2


def test_a_report_no_job_can_make_is_refused_and_counted(world: World) -> None:
    """Issue 46: iteration 1 -> 10^12 twice summed 2x10^12 iterations and 2x10^24 s.  A report
    that moves its job further than a job can is refused (bad_value), counting starts again there."""
    line = "Training epoch 0, iteration {}/99 | train_step_timing in s: 1000000 | consumed_samples: {}\n"
    absurd = [line.format(1, 1), line.format(10**12, 2), line.format(1, 1), line.format(10**12, 2)]
    real = [line.format(n, 32 * n).replace("1000000", "0.5") for n in (2, 3, 4)]
    world.file("/scratch/slurm-6.out", "".join(absurd + real))
    collector = world.collector(paths=("/scratch/slurm-*.out",))
    s = run(collector)
    collector.close()
    assert job(s, "iterations_total", "6", "nemo") == 2  # 2 -> 4 (10^12 -> 2 went back: counting again)
    assert job(s, "iteration_seconds_total", "6", "nemo") == 1.0
    assert by(s, "log_lines_invalid_total", "reason")["bad_value"] == 2


def owned(path: Path, uid: int) -> Path:
    os.chown(path, uid, uid)
    return path


def nemo_steps(first: int, last: int) -> str:
    line = "Training epoch 0, iteration {0}/999 | train_step_timing in s: 0.5 | consumed_samples: {1}\n"
    return "".join(line.format(n, 32 * (n + 1)) for n in range(first, last + 1))


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users are made with chown")
def test_a_users_file_named_for_another_users_job_is_counted_apart(world: World) -> None:
    """Issue 46: under a glob users write in, eve's /scratch/eve/slurm-5000.out was summed into
    alice's job 5000 (90 -> 210 iterations) and moved its last report, hiding its stall."""
    alice, eve = 1000, 1001
    world.process(4001, "/system.slice/slurmstepd.scope/job_5000/step_batch/user/task_0")
    world.answers["5000"] = job_record(
        "5000", "vm", "/scratch/alice/slurm-5000.out", "/scratch/alice/slurm-5000.out", uid=alice
    )
    stalled = owned(world.file("/scratch/alice/slurm-5000.out", nemo_steps(0, 90)), alice)
    os.utime(stalled, (NOW - 720, NOW - 720))
    owned(world.file("/scratch/eve/slurm-5000.out", nemo_steps(90, 210)), eve)
    collector = world.collector(slurm=True, paths=("/scratch/*/slurm-*.out",))
    s = run(collector)
    collector.close()
    assert jobs(s) == [("5000", "nemo"), ("5000@uid1001", "nemo")]
    assert job(s, "iterations_total", "5000", "nemo") == 90
    assert job(s, "last_iteration_timestamp_seconds", "5000", "nemo") == NOW - 720  # the stall still shows
    assert job(s, "iterations_total", "5000@uid1001", "nemo") == 120


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users are made with chown")
def test_without_slurms_word_a_job_is_its_files_only_owners(world: World) -> None:
    """slurm: false (or a job Slurm was not asked about): a job's files count for it while they
    have one owner; when two users' files name the same job, each owner's count is apart."""
    owned(world.file("/scratch/alice/slurm-7.out", nemo_steps(0, 10)), 1000)
    owned(world.file("/scratch/eve/slurm-7.out", nemo_steps(0, 50)), 1001)
    owned(world.file("/scratch/alice/slurm-8.out", nemo_steps(0, 10)), 1000)
    owned(world.file("/scratch/alice/slurm-8_1.out", nemo_steps(0, 10)), 1000)
    collector = world.collector(paths=("/scratch/*/slurm-*.out",))
    s = run(collector)
    collector.close()
    assert jobs(s) == [("7@uid1000", "nemo"), ("7@uid1001", "nemo"), ("8", "nemo"), ("8_1", "nemo")]
    assert job(s, "iterations_total", "7@uid1001", "nemo") == 50
    assert job(s, "iterations_total", "8", "nemo") == 10


def test_empty_and_idle_files_hold_no_slot_a_live_job_needs(world: World) -> None:
    """Issue 46: 200 empty slurm-*.out files filled the 128 followed files, and a new job's
    output (a Slurm-found one shares the cap) was never read."""
    for n in range(200):
        world.file(f"/scratch/slurm-{n}.out", "")
    for n in range(200, 330):  # idle: printed once, long ago
        world.file(f"/scratch/slurm-{n}.out", "hello\n")
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    collector = world.collector(slurm=True, paths=("/scratch/slurm-*.out",))
    for _ in range(3):
        s = run(collector)
        world.now[0] += 15
    world.file("/out/4242.out", fixture("nemo"))
    world.file("/scratch/slurm-9999.out", fixture("nemo"))
    s = run(collector)
    collector.close()
    assert jobs(s) == [("4242", "nemo"), ("9999", "nemo")]
    assert job(s, "iterations_total", "4242", "nemo") == 29
    assert job(s, "iterations_total", "9999", "nemo") == 29
    assert s[("lockstep_framework_skipped_log_files", frozenset())] == 0


def test_a_kernel_threads_cgroup_and_environment_are_not_read(world: World) -> None:
    """Kernel threads (PF_KTHREAD in their stat's flags; half of an idle node's processes) belong
    to no job: their files are not read (here they would name job 77, which is never asked)."""
    (world.proc / "2").mkdir()
    (world.proc / "2" / "stat").write_text("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 1 0 0 20 0 1 0 30\n")
    (world.proc / "2" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    (world.proc / "2" / "environ").write_bytes(b"SLURM_JOB_ID=77\0")
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    world.file("/out/4242.out", fixture("nemo"))
    collector = world.collector(slurm=True)
    s = run(collector)
    collector.close()
    assert world.calls == ["-o show job 4242"]
    assert jobs(s) == [("4242", "nemo")]


def test_job_ids_slurm_does_not_answer_for_cannot_starve_a_real_jobs_discovery(world: World) -> None:
    """Issue 46: 8 processes with SLURM_JOB_ID=1..8 (anyone can start them) took every scontrol
    call of every discovery, and the real job was never asked.  A job of a cgroup is asked
    first, and a failed id is asked again after 60 s, 120 s, ..., after the new ones."""
    for fake in range(1, 9):
        procfs.stat(world.proc, 6000 + fake)
        (world.proc / str(6000 + fake) / "cgroup").write_text("0::/user.slice/user-1001.slice/session-1.scope\n")
        (world.proc / str(6000 + fake) / "environ").write_bytes(f"HOME=/x\0SLURM_JOB_ID={fake}\0".encode())
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    world.file("/out/4242.out", fixture("nemo"))
    collector = world.collector(slurm=True)
    s = run(collector)
    assert world.calls[0] == "-o show job 4242"  # slurmd's cgroup before anyone's environment
    assert len(world.calls) == 8  # 4242 and 7 fakes
    assert job(s, "iterations_total", "4242", "nemo") == 29
    asked_at: dict[str, list[float]] = {}
    for _ in range(40):  # 10 minutes of 15-s rounds
        before = len(world.calls)
        world.now[0] += 15
        run(collector)
        for call in world.calls[before:]:
            asked_at.setdefault(call.split()[-1], []).append(world.now[0])
    collector.close()
    assert "4242" not in asked_at  # answered: never asked again
    # Each fake asked again after 60 s, 120 s, 240 s (discovery runs every 60 s): not every round.
    gaps = [later - earlier for earlier, later in zip(asked_at["1"], asked_at["1"][1:])]
    assert gaps == sorted(gaps) and len(asked_at["1"]) <= 4
    assert len(world.calls) <= 8 + 8 * 4


def test_a_job_found_after_the_first_round_is_read_from_its_first_line(world: World) -> None:
    """Issue 46: the follower was made at the first discovery that found a job (up to a minute
    after the agent started), and read the files present then from their end: a job's first
    reports were lost.  start_at: end is for what was there when the agent started."""
    collector = world.collector(slurm=True, start_at="end")
    with pytest.raises(NothingHere):
        run(collector)  # nothing yet
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    world.file("/out/4242.out", fixture("nemo"))  # 30 reports before discovery finds the job
    world.now[0] += 60
    s = run(collector)
    collector.close()
    assert job(s, "iterations_total", "4242", "nemo") == 29


def test_a_short_job_is_asked_at_once_and_read_after_it_ended(world: World) -> None:
    """Issue 46: jobs were looked for once a minute, only while they ran: one that printed and
    ended within a minute was never read.  Now /proc is scanned every round, a new job is
    asked at once, and a job that ended before Slurm answered is still asked and read."""
    collector = world.collector(slurm=True, paths=("/nothing/*.out",))
    run(collector)
    world.now[0] += 15  # a job starts between two discoveries...
    world.process(4001, "/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0")
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    world.file("/out/4242.out", fixture("nemo"))
    s = run(collector)
    assert world.calls == ["-o show job 4242"]  # ...and is asked in the round that sees it
    assert job(s, "iterations_total", "4242", "nemo") == 29
    # Another job, seen while slurmctld does not answer, ends before it is asked again.
    world.process(4002, "/system.slice/slurmstepd.scope/job_4243/step_batch/user/task_0")
    world.now[0] += 15
    run(collector)
    assert world.calls[-1] == "-o show job 4243"  # no answer
    shutil.rmtree(world.proc / "4002")
    world.answers["4243"] = job_record("4243", "vm", "/out/4243.out", "/out/4243.out")
    world.file("/out/4243.out", fixture("nemo"))
    for _ in range(4):
        world.now[0] += 15
        s = run(collector)
    collector.close()
    assert world.calls[-1] == "-o show job 4243"  # asked again a minute later, though it ended
    assert job(s, "iterations_total", "4243", "nemo") == 29


def test_a_job_that_lives_less_than_a_round_is_seen_by_its_cgroup_and_read(world: World) -> None:
    """Issue 46: a job that starts and ends between two rounds leaves no process to find; the
    cgroup slurmd made for it (job_<id> under slurmstepd.scope, cgroup v2) is reported by
    inotify, the job asked about after its end (scontrol answers for MinJobAge) and its output read."""
    scope = world.root / "sys" / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope"
    scope.mkdir(parents=True)
    collector = world.collector(slurm=True)
    with pytest.raises(NothingHere):
        run(collector)
    world.answers["4242"] = job_record("4242", "vm", "/out/4242.out", "/out/4242.out")
    world.file("/out/4242.out", fixture("nemo"))
    (scope / "job_4242").mkdir()  # the job starts, prints, and ends within the round
    (scope / "job_4242").rmdir()
    wait_until(lambda: collector._discovery.cgroups._born, what="the cgroup's event")
    world.now[0] += 15
    s = run(collector)
    collector.close()
    assert world.calls == ["-o show job 4242"]
    assert job(s, "iterations_total", "4242", "nemo") == 29


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users are made with chown")
def test_a_file_whose_owner_cannot_be_told_counts_for_no_job(world: World) -> None:
    """A user's file read through its descriptor after its path was given to a link to the job
    user's real output: the path's owner is not the lines' writer, so the lines count for no job."""
    alice, eve = 1000, 1001
    real = owned(world.file("/scratch/alice/slurm-5000.out", nemo_steps(0, 10)), alice)
    fake = owned(world.file("/scratch/eve/slurm-5000.out", "hello\n"), eve)
    (world.root / "elsewhere").mkdir()
    writer = world.root / "elsewhere" / "link"
    os.link(fake, writer)  # written through a link no watch sees: no event reads it before the swap
    collector = world.collector(paths=("/scratch/*/slurm-*.out",))
    run(collector)
    with open(writer, "a") as out:
        out.write(nemo_steps(10, 500))
    fake.unlink()  # still read through the open descriptor...
    fake.symlink_to(real)  # ...while its path names alice's file
    s = run(collector)
    collector.close()
    assert jobs(s) == [("5000", "nemo")]
    assert job(s, "iterations_total", "5000", "nemo") == 10
    assert by(s, "log_lines_invalid_total", "reason")["no_job"] == 491
