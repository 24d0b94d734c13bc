"""The Slurm collector against a real single-node Slurm started by the test (slurmctld, slurmd, munge)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, require_real, samples, slurm_cluster, wait_until

# Tier: a real Slurm and munge, /dev/nvidia* nodes made with mknod (tests/conftest.py).
pytestmark = pytest.mark.machine


@pytest.fixture(scope="module")
def cluster() -> Iterator[slurm_cluster.SlurmCluster]:
    require_real("root and Debian slurm-wlm + munge", slurm_cluster.available())
    # Not under pytest's 0700 tmp dir: the jobs' user and an unprivileged agent must reach it.
    root = Path(tempfile.mkdtemp(prefix="lockstep-slurm-", dir="/tmp"))
    started = slurm_cluster.start(root)
    yield started
    started.stop()
    shutil.rmtree(root, ignore_errors=True)


# The fake NVML's GPUs, by NVML index: the /dev/nvidiaN minor numbers in yet another order
# than gres.conf's (2, 0, 3, 1), as on nodes where existing tools attribute GPUs wrongly.
NVML_MINORS = (1, 3, 0, 2)


def write_gpu_spec(cluster: slurm_cluster.SlurmCluster, processes: dict[int, list[int]]) -> Path:
    """A fake NVML spec for the cluster's 4 GPUs, with compute processes by NVML index."""
    lines = ["gpus:"]
    for index, minor in enumerate(NVML_MINORS):
        lines += [f"  - uuid: GPU-00000000-0000-0000-0000-00000000000{index}", f"    minor_number: {minor}"]
        if processes.get(index):
            lines.append("    processes:")
            lines += [f"      - {{pid: {pid}, used_memory_bytes: 1000000}}" for pid in processes[index]]
    spec = cluster.root / "gpus.yml"
    spec.write_text("\n".join(lines) + "\n")
    spec.chmod(0o644)
    return spec


def job_pids(cluster: slurm_cluster.SlurmCluster, job_id: str) -> list[int]:
    """The job's processes, from the local slurmd (slurmstepd itself excluded)."""
    out = cluster.run("scontrol", "listpids", job_id)
    pids = [int(line.split()[0]) for line in out.splitlines()[1:] if line.split() and line.split()[0].isdigit()]
    return [p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() != "slurmstepd"]


def logging_scontrol(cluster: slurm_cluster.SlurmCluster) -> tuple[dict[str, str], Path]:
    """The cluster's environment with an scontrol first on PATH that logs its arguments, then runs
    the real one; and the log.  The agent asks about every job cgroup on the host, another
    Slurm's too, so its own request counter is no count of this cluster's jobs' requests."""
    bin_dir = cluster.root / "bin"
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    log = cluster.root / "scontrol.log"
    log.touch()
    log.chmod(0o666)  # the unprivileged agent appends to it
    real = shutil.which("scontrol")
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    script.chmod(0o755)
    return {**cluster.env, "PATH": f"{bin_dir}:{cluster.env['PATH']}"}, log


def once(
    cluster: slurm_cluster.SlurmCluster,
    user: str | None = None,
    gpu_spec: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    args = ["once", "--collector.disable-defaults", "--collector.slurm"]
    if gpu_spec is not None:
        args += ["--collector.gpu", "--gpu.fake-nvml", str(gpu_spec)]
    command = [sys.executable, "-m", "lockstep.agent.cli", *args]
    if user is not None:
        command = [sys.executable, "-c", slurm_cluster.AS_USER, user, *args]
    result = subprocess.run(command, env=env or cluster.env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return samples(result.stdout)


def job_gpus(s: dict) -> set[tuple[str, str, str]]:
    return {
        (dict(labels)["job_id"], dict(labels)["gpu"], dict(labels)["uuid"])
        for name, labels in s
        if name == "lockstep_slurm_job_gpu_info"
    }


def job_info(s: dict) -> dict[str, dict[str, str]]:
    return {dict(labels)["job_id"]: dict(labels) for name, labels in s if name == "lockstep_slurm_job_info"}


def test_jobs_on_a_real_slurm(cluster: slurm_cluster.SlurmCluster) -> None:
    train = cluster.sbatch("--gres=gpu:2", "-J", "pretrain 70b")
    bobs = cluster.sbatch("--gres=gpu:1", "-J", "bobjob", user=slurm_cluster.SECOND_USER)
    array = cluster.sbatch("--array=1-2", "-J", "sweep")
    array_tasks = [f"{array}_1", f"{array}_2"]
    cluster.wait_running([train, bobs, *array_tasks])
    task_ids = {
        line.split()[0]: line.split()[1] for line in cluster.run("squeue", "-h", "-r", "-o", "%i %A").splitlines()
    }  # array task "N_1" -> its own job id

    ours = {train, bobs, *task_ids.values()}
    s = once(cluster)  # as root: job details from the jobs' environment, no slurmctld call
    jobs = {job_id: info for job_id, info in job_info(s).items() if job_id in ours}
    assert jobs[train] == {
        "job_id": train, "user": "root", "account": "", "partition": "gpu", "job_name": "pretrain 70b",
        "array_job_id": "", "array_task_id": "",
    }  # fmt: skip
    assert (jobs[bobs]["user"], jobs[bobs]["job_name"]) == (slurm_cluster.SECOND_USER, "bobjob")
    for task in array_tasks:
        job_id = task_ids[task]
        assert (jobs[job_id]["array_job_id"], jobs[job_id]["array_task_id"]) == (array, task.split("_")[1])
    assert len(jobs) == 4
    for job_id in jobs:
        assert s[("lockstep_slurm_job_processes", frozenset({("job_id", job_id)}))] >= 1
        if cluster.cgroup_v1:
            assert s[("lockstep_slurm_job_memory_used_bytes", frozenset({("job_id", job_id)}))] > 0
    node = next(dict(labels) for name, labels in s if name == "lockstep_slurm_node_info")
    assert (node["slurm_node"], node["state"]) == (cluster.node, "MIXED")

    # GPUs: IDX 0-1 (the 2-GPU job) are gres.conf's 1st and 2nd files, /dev/nvidia2 and
    # /dev/nvidia0, i.e. the NVML GPUs with minor 2 (index 3) and 0 (index 2); the 1-GPU job's
    # IDX 2 is /dev/nvidia3, minor 3, NVML index 1.  The fake NVML runs the 2-GPU job's
    # process on GPU 3, and also the 1-GPU job's process on GPU 2, which is not its own.
    uuid = "GPU-00000000-0000-0000-0000-00000000000{}".format
    spec = write_gpu_spec(cluster, {3: job_pids(cluster, train), 2: job_pids(cluster, bobs)})
    with_gpus = once(cluster, gpu_spec=spec)
    assert job_gpus(with_gpus) == {(train, "3", uuid(3)), (train, "2", uuid(2)), (bobs, "1", uuid(1))}
    assert with_gpus[("lockstep_slurm_gpu_attribution_mismatches", frozenset())] == 1

    # Unprivileged (the agent's systemd user): environments are unreadable, so the same
    # details, GPU indices included, come from `scontrol show job`, one request per job.
    env, log = logging_scontrol(cluster)
    unprivileged = once(cluster, user="nobody", gpu_spec=spec, env=env)
    assert {j: i for j, i in job_info(unprivileged).items() if j in ours} == jobs
    assert job_gpus(unprivileged) == job_gpus(with_gpus)
    requests = ("lockstep_slurm_controller_requests_total", frozenset({("command", "scontrol show job")}))
    asked = [line.split()[-1] for line in log.read_text().splitlines() if line.startswith("-d -o show job ")]
    assert sorted(job for job in asked if job in ours) == sorted(ours)  # one request for each of ours
    # Another Slurm's jobs on this host are asked about too (and counted): at least ours.
    assert unprivileged[requests] == len(asked) >= 4

    # Cancelled jobs' series are gone at the next round.
    cluster.run("scancel", train, bobs, array)
    wait_until(lambda: not cluster.run("squeue", "-h").strip(), timeout=30, what="jobs to end")
    wait_until(lambda: not set(job_info(once(cluster))) & ours, timeout=30, what="job series to disappear")
    after = once(cluster)
    assert not [n for n, labels in after if n.startswith("lockstep_slurm_job_") and dict(labels)["job_id"] in ours]
