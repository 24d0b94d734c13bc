"""The framework_logs collector against a real single-node Slurm started by the test (slurmctld,
slurmd, munge): a job that starts, prints and ends between two rounds is read (issue 46, item 16)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.gpus import GpuInventory
from lockstep.agent.seams import Seams
from lockstep.collectors.framework_logs import FrameworkLogsCollector, FrameworkLogsOptions
from lockstep.collectors.toolkit.scontrol import SCONTROL
from tests.support import FIXTURES, collected, require_real, slurm_cluster, wait_until

# Tier: a real Slurm and munge (tests/conftest.py).
pytestmark = pytest.mark.machine


@pytest.fixture(scope="module")
def cluster() -> Iterator[slurm_cluster.SlurmCluster]:
    require_real("root and Debian slurm-wlm + munge", slurm_cluster.available())
    root = Path(tempfile.mkdtemp(prefix="lockstep-slurm-", dir="/tmp"))
    # Slurm's default MinJobAge (the harness's is 2 s): scontrol answers for a job 300 s after its end.
    started = slurm_cluster.start(root, conf={"MinJobAge": "300"})
    yield started
    started.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_a_job_that_ends_between_two_rounds_is_read_on_a_real_slurm(cluster: slurm_cluster.SlurmCluster) -> None:
    if not cluster.cgroup_v1:
        pytest.skip("this test Slurm makes job cgroups (proctrack/cgroup) with cgroup v1 only")
    out = cluster.root / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    shutil.copy(FIXTURES / "framework_logs" / "nemo.log", out / "nemo.log")
    (out / "nemo.log").chmod(0o644)
    user = slurm_cluster.SECOND_USER

    def scontrol(args: list[str], timeout: float) -> str:
        done = subprocess.run(["scontrol", *args], env=cluster.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise subprocess.CalledProcessError(done.returncode, args, done.stdout, done.stderr)
        return done.stdout

    collector = FrameworkLogsCollector(
        CollectorContext(
            Paths(sysfs=Path("/sys"), procfs=Path("/proc"), rootfs=Path("/")),
            FrameworkLogsOptions(slurm=True, pods=False, node_name=cluster.node),
            logging.getLogger("test"),
            seams=Seams(SCONTROL.replaced_by(scontrol)),
            gpu_inventory=GpuInventory(),
        )
    )
    try:
        # A job of the user runs (its cgroup shows where the user's job cgroups are made)...
        running = cluster.run(
            "sbatch", "--parsable", f"--output={out}/long-%j.out", "--wrap", "sleep 3600", user=user
        ).strip()
        cluster.wait_running([running])
        wait_until(
            lambda: _rounds(collector) and running in collector._found.running, step=0.5, what="the running job seen"
        )
        # ...then a second one prints its 30 reports and ends before the next round.
        short = cluster.run(
            "sbatch", "--parsable", f"--output={out}/short-%j.out", "--wrap", f"cat {out}/nemo.log", user=user
        ).strip()
        wait_until(
            lambda: short not in cluster.run("squeue", "-h", "-o", "%i").split(), timeout=60, what="the job's end"
        )
        time.sleep(1)
        s = collected(collector)
    finally:
        collector.close()
    key = ("lockstep_framework_iterations_total", frozenset({"job_id": short, "framework": "nemo"}.items()))
    assert s[key] == 29  # every report, read after the job ended


def _rounds(collector: FrameworkLogsCollector) -> bool:
    try:
        collected(collector)
    except NothingHere:
        pass
    return True
