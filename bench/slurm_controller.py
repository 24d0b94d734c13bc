"""Requests the agent makes to slurmctld per minute at default settings, from sdiag's RPC counts.

    sudo .venv/bin/python bench/slurm_controller.py [--minutes 2]

Starts a real single-node Slurm (as the tests do: root, Debian slurm-wlm + munge), runs
two jobs, then runs `lockstep run` with only the slurm collector at its defaults, twice:
as root (job details from the jobs' environment) and as an unprivileged user (job details
from `scontrol show job`, once per job).  Nothing else talks to slurmctld meanwhile, so the
change in sdiag's RPC counts is the agent's.  Target (issue 6): at most 2 per minute per node.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import slurm_cluster  # noqa: E402


def measure(cluster: slurm_cluster.SlurmCluster, minutes: float, user: str | None) -> None:
    """Run the agent; print its slurmctld RPCs in its first 30 s, then per minute in steady state."""
    args = ["run", "--collector.disable-defaults", "--collector.slurm", "--listen", "127.0.0.1:0"]
    command = [sys.executable, "-m", "lockstep.agent.cli", *args, "--log.level", "error"]
    if user is not None:
        command = [sys.executable, "-c", slurm_cluster.AS_USER, user, *args, "--log.level", "error"]
    label = "as root" if user is None else f"unprivileged ({user})"
    before = cluster.rpc_counts()
    agent = subprocess.Popen(command, env=cluster.env, cwd=Path(__file__).resolve().parent.parent)
    try:
        time.sleep(30)
        startup = cluster.rpc_counts()
        time.sleep(minutes * 60)
        steady = cluster.rpc_counts()
    finally:
        agent.terminate()
        agent.wait(10)
    first, rest = rpc_delta(before, startup), rpc_delta(startup, steady)
    print(f"agent {label}, first 30 s (node state + 2 new jobs): {sum(first.values())} RPCs {first}")
    print(f"agent {label}, steady state: {sum(rest.values()) / minutes:.2f} RPCs per minute over {minutes:g} min "
          f"(target <= 2) {rest}")  # fmt: skip


def rpc_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    delta.pop("REQUEST_STATS_INFO", None)  # this script's own sdiag
    return delta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=4.0, help="steady-state window of each phase")
    args = parser.parse_args()
    if not slurm_cluster.available():
        print("needs root and Debian slurm-wlm + munge", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="lockstep-slurm-bench-", dir="/tmp"))
    cluster = slurm_cluster.start(root)
    try:
        jobs = [cluster.sbatch("--gres=gpu:2", "-J", "a"), cluster.sbatch("--gres=gpu:1", "-J", "b")]
        # `scontrol show node` costs two RPCs (node and partition info); `show job` one.
        cluster.wait_running(jobs)
        time.sleep(2)
        for user in (None, "nobody"):
            measure(cluster, args.minutes, user)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
