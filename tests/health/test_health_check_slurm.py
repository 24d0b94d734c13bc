"""`lockstep health-check --drain` as a real Slurm's HealthCheckProgram (docs/health-check.md).

A single-node Slurm (tests/support/slurm_cluster.py) whose slurmd runs the check every
HealthCheckInterval (2 s), as root, with the environment slurmd gives it.  The check reads a
local agent: two `lockstep demo`s serve, a healthy node and one whose GPU 5 fell off the bus, and
the program (a two-line wrapper, as a site would install) asks whichever the test names in a
file.  Each step waits for two more runs of the program (it logs each), then reads Slurm:

1. healthy: the node stays in service, no reason;
2. drained by someone else ("maintenance: PSU swap"), then the lost GPU: their reason stays;
3. resumed by them, the lost GPU: drained with Lockstep's reason (`sinfo -R` shows it);
4. healthy again: still drained (the check never returns a node to service).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import LOCKSTEP, AgentProcess, require_real, slurm_cluster, wait_until

# Tier: a real Slurm (users, /dev nodes, the host's processes).
pytestmark = [pytest.mark.machine, pytest.mark.e2e]

INTERVAL = 2  # HealthCheckInterval, seconds


@dataclass
class Node:
    cluster: slurm_cluster.SlurmCluster
    root: Path
    agents: dict[str, AgentProcess]

    def ask(self, scenario: str) -> None:
        """The check reads the demo of this scenario from its next run on."""
        staged = self.root / ".agent-url"
        staged.write_text(f"{self.agents[scenario].url}/metrics\n")
        staged.rename(self.root / "agent-url")

    def runs(self) -> int:
        path = self.root / "runs.log"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def after_two_runs(self) -> None:
        """Wait until the program has started twice more and the second has ended."""
        wanted = self.runs() + 2
        wait_until(lambda: self.runs() >= wanted, timeout=15 * INTERVAL, step=0.2, what=f"{wanted} health checks")
        time.sleep(1.0)  # the last one's scontrol, if any, done (it takes well under a second)

    def state(self) -> tuple[str, str]:
        """(sinfo's state, the reason) of the node."""
        shown = self.cluster.run("sinfo", "-h", "-N", "-n", self.cluster.node, "-o", "%T|%E").strip()
        state, _, reason = shown.partition("|")
        return state, reason

    def log(self) -> str:
        path = self.root / "health.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    require_real("root and Debian slurm-wlm + munge", slurm_cluster.available())
    # Not under pytest's 0700 tmp dir: slurmd's programs read it.
    root = Path(tempfile.mkdtemp(prefix="lockstep-health-", dir="/tmp"))
    root.chmod(0o755)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        agents = {
            scenario: cleanup.enter_context(AgentProcess("demo", "--scenario", scenario))
            for scenario in ("healthy", "gpu-lost")
        }
        program = root / "lockstep-health-check"
        # As a site installs it: slurmd's environment has no SLURM_CONF (the test's Slurm is not
        # at /etc/slurm) and no PATH to the checkout's Python.
        program.write_text(
            "#!/bin/sh\n"
            f"export SLURM_CONF={root / 'slurm.conf'} PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
            f"echo run >> {root / 'runs.log'}\n"
            f'exec {" ".join(LOCKSTEP)} health-check --agent "$(cat {root / "agent-url"})" --drain '
            f">> {root / 'health.log'} 2>&1\n"
        )
        program.chmod(0o755)
        (root / "agent-url").write_text(f"{agents['healthy'].url}/metrics\n")  # slurmd runs it at its start
        conf = {"HealthCheckProgram": str(program), "HealthCheckInterval": str(INTERVAL), "HealthCheckNodeState": "ANY"}
        cluster = slurm_cluster.start(root, conf=conf)
        cleanup.callback(cluster.stop)
        yield Node(cluster, root, agents)


def test_the_check_drains_a_node_with_a_lost_gpu_and_nothing_else(node: Node) -> None:
    cluster = node.cluster
    try:
        # 1. Healthy: left in service.
        node.after_two_runs()
        assert node.state() == ("idle", "none")
        assert "healthy: 8 GPUs, 10 IB ports, 7 mounts (agent http://127.0.0.1:" in node.log()

        # 2. Drained by someone else: their reason stays, whatever the check finds.
        cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=DRAIN", "Reason=maintenance: PSU swap")
        node.ask("gpu-lost")
        node.after_two_runs()
        assert node.state() == ("drained", "maintenance: PSU swap")
        assert f"node {cluster.node} left as it is: IDLE+DRAIN by someone else" in node.log()

        # 3. Back in service by their hand: the lost GPU drains it, with Lockstep's reason.
        cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=RESUME")
        node.after_two_runs()
        assert node.state() == ("drained", "lockstep: GPU 5 lost (fell off the bus) (+1 more)")
        assert "unhealthy: GPU 5 lost (fell off the bus) (+1 more)" in node.log()

        # 4. Healthy again: the check never returns a node to service.
        node.ask("healthy")
        node.after_two_runs()
        assert node.state() == ("drained", "lockstep: GPU 5 lost (fell off the bus) (+1 more)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nhealth.log:\n{node.log()[-3000:]}") from None
