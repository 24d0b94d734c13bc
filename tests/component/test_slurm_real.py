"""The Slurm collector against a real single-node Slurm started by the test (slurmctld, slurmd, munge)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurm_cluster
from tests.conftest import REPO, require_real, samples, wait_until


@pytest.fixture(scope="module")
def cluster() -> Iterator[slurm_cluster.SlurmCluster]:
    require_real("root and Debian slurm-wlm + munge", slurm_cluster.available())
    # Not under pytest's 0700 tmp dir: the jobs' user and an unprivileged agent must reach it.
    root = Path(tempfile.mkdtemp(prefix="lockstep-slurm-", dir="/tmp"))
    started = slurm_cluster.start(root)
    yield started
    started.stop()
    shutil.rmtree(root, ignore_errors=True)


# Runs the agent as an unprivileged user.  The interpreter lives under /root here, where that
# user cannot reach it, so the process starts as root, imports everything, then drops to the
# user for good before the agent does anything.
AS_USER = """
import os, pwd, sys
import encodings.idna  # the HTTP server's getfqdn needs it
import lockstep.agent.cli, lockstep.agent.registry, lockstep.simulation.fake_nvml, lockstep.collectors.slurm, pynvml
lockstep.agent.cli.build_parser(lockstep.agent.registry.discover()).parse_args(sys.argv[2:])  # every lazy import, now
user = pwd.getpwnam(sys.argv[1])
os.setgroups([])
os.setgid(user.pw_gid)
os.setuid(user.pw_uid)
sys.exit(lockstep.agent.cli.main(sys.argv[2:]))
"""


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


def once(cluster: slurm_cluster.SlurmCluster, user: str | None = None, gpu_spec: Path | None = None) -> dict:
    args = ["once", "--collector.disable-defaults", "--collector.slurm"]
    if gpu_spec is not None:
        args += ["--collector.gpu", "--gpu.fake-nvml", str(gpu_spec)]
    command = [sys.executable, "-m", "lockstep.agent.cli", *args]
    if user is not None:
        command = [sys.executable, "-c", AS_USER, user, *args]
    result = subprocess.run(command, env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=60)
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
    unprivileged = once(cluster, user="nobody", gpu_spec=spec)
    assert {j: i for j, i in job_info(unprivileged).items() if j in ours} == jobs
    assert job_gpus(unprivileged) == job_gpus(with_gpus)
    requests = ("lockstep_slurm_controller_requests_total", frozenset({("command", "scontrol show job")}))
    assert unprivileged[requests] == 4

    # Cancelled jobs' series are gone at the next round.
    cluster.run("scancel", train, bobs, array)
    wait_until(lambda: not cluster.run("squeue", "-h").strip(), timeout=30, what="jobs to end")
    wait_until(lambda: not set(job_info(once(cluster))) & ours, timeout=30, what="job series to disappear")
    after = once(cluster)
    assert not [n for n, labels in after if n.startswith("lockstep_slurm_job_") and dict(labels)["job_id"] in ours]
