"""The agent's exposition on the simulated node at chosen simulated times, in-process.

``lockstep demo --once`` prints one round at simulated time 0; the cardinality test and the
fleet benchmark (bench/fleet.py) also need later moments, to see which series come and go
and how counters move.  Each moment is one fresh round of every built-in collector on the
node rendered at that time, exactly what ``demo --once`` does at time 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from lockstep.agent.cli import collect_once
from lockstep.agent.config import Overrides
from lockstep.agent.daemon import Setup
from lockstep.agent.registry import discover
from lockstep.simulation import temporary_node


def expositions(scenario: str, times: Sequence[float]) -> list[str]:
    """The exposition (text format) at each simulated time, in order."""
    node, directory = temporary_node(scenario)
    with directory:
        available = {name: r.cls for name, r in discover().collectors.items() if r.builtin}
        paths = {"sysfs": str(node.paths.sysfs), "procfs": str(node.paths.procfs), "rootfs": str(node.paths.rootfs)}
        # Generous deadlines: the round is a snapshot, not a test of the collectors' timing, and a
        # busy machine must not turn a slow read into a "stuck" collector and a missing family.
        config_file = Path(directory.name) / "snapshot.yml"
        config_file.write_text(
            yaml.safe_dump({"collectors": {name: {"deadline": "120s", "interval": "120s"} for name in available}})
        )
        setup = Setup(config_file, available, Overrides(paths=paths, options=node.options), node.seams)
        config = setup.load()
        out = []
        for t in times:
            node.render(t)
            # A round on a machine busy enough to push a collector past its deadline is
            # incomplete: take another (the node is the same at t), three times at most.
            for _attempt in range(3):
                body, failures = collect_once(setup, config)
                if not failures:
                    break
            else:
                raise RuntimeError(f"scenario {scenario} at t={t}: " + "; ".join(failures))
            out.append(body.decode())
        return out
