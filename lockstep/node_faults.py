"""A node's own faults over its record's window (issue 45), as data: read by both sides.

- the rules (alerts/nodes.py) record each fault per node over NODE_RECORD_WINDOW
  (`instance:...:increase7d`, one series per node that had it, and per XID code), which
  LockstepNodeHurtsJobs lists and the fleet dashboard ranks;
- `lockstep report --node` (lockstep/report/node.py) evaluates the same template per series (a
  GPU, a port) on the node's agents only, over the window it is asked for.

Each template counts a counter's growth over WIN, series by series, from its two edges: its value
now less its value WIN ago, two lookups a series where increase() over a week would decode every
sample of it (a 1,024-node fleet's GPUs: ~40,000 samples a series, a billion an evaluation).  The
edges miss nothing between them, but they cannot see through a reset: a series that went down
(its driver reloaded, its node rebooted) counts what it holds now, the events since the reset;
and a series first seen inside the window counts whole (a node whose agent is new, or a counter
born at its first event).  The agent's XID counts are both (born at 1 at a GPU's first XID of a
code, started again with the agent) and few (only GPUs that had one): a series there when the
window began is read with increase(), which counts across resets; one born in it counts what it
holds (its events since its first: the window is read once, the job report's budget).

In a template SEL stands for the matchers that pick the node's series (none in the rules, which
judge every node) and WIN for the window, as in lockstep/suspects.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockstep import thresholds as T
from lockstep.suspects import render

# The GPU clock event reasons whose time is a fault of the node's: heat, and the hardware's own
# slowdowns (the straggler rules' suspects).  The power cap and sync boost are policy, not faults.
THROTTLE_REASONS = T.SUSPECT_GPU_THROTTLE_REASONS
WINDOW = T.NODE_RECORD_WINDOW


def edges(series: str, window: str = "WIN") -> str:
    """A counter's growth over the window per series, from its edges (see the module docstring)."""
    return f"({series} - {series} offset {window} >= 0 or {series})"


def events(series: str, window: str = "WIN") -> str:
    """A rare-event counter's count over the window per series (the agent's XID counts; the job
    report's too)."""
    return f"((increase({series}[{window}]) and {series} offset {window}) or {series})"


@dataclass(frozen=True)
class NodeFault:
    name: str
    says: str  # the words for it, in the report and the alert
    template: str  # its count per series over WIN (SEL: the node's matchers)
    by: tuple[str, ...] = ()  # labels its record keeps besides cluster and instance
    unit: str = ""  # "" for events, "s" for seconds
    place: str = "gpu"  # what a series of it is: "gpu" (its gpu label) or "port" (device, port)

    @property
    def record(self) -> str:
        """Its recording rule's name, one series per node (and per `by`)."""
        return f"instance:lockstep_node_{self.name}:increase{WINDOW}"

    def per_series(self, sel: str = "", window: str = WINDOW) -> str:
        return render(self.template, sel, window)


# In the order the report lists them.
NODE_FAULTS: tuple[NodeFault, ...] = (
    NodeFault("xid_errors", "XID errors", events("lockstep_gpu_xid_errors_total{SEL}"), by=("xid",)),
    NodeFault(
        "ecc_uncorrected_errors",
        "uncorrectable ECC errors",
        edges('lockstep_gpu_ecc_errors_total{type="uncorrected", SEL}'),
    ),
    # A gauge that only grows (rows remapped over the GPU's life), read as a counter.
    NodeFault("remapped_rows", "memory rows remapped", edges("lockstep_gpu_remapped_rows{SEL}"), by=("cause",)),
    NodeFault("link_downs", "InfiniBand link downs", edges("lockstep_ib_port_link_downed_total{SEL}"), place="port"),
    NodeFault(
        "gpu_throttled_seconds",
        "GPU clocks held down",
        edges(f'lockstep_gpu_clock_event_seconds_total{{reason=~"{"|".join(THROTTLE_REASONS)}", SEL}}'),
        by=("reason",),
        unit="s",
    ),
)

# GPUs lost (fell off the bus, or NVML cannot reach them): how many a node has now, recorded only
# where it has one, and the most it had at once in the window.  The report reads each GPU's
# minutes lost from lockstep_gpu_up itself.
GPU_LOST = "lockstep_gpu_up == 0"
GPUS_LOST = "instance:lockstep_gpus_lost:count"
GPUS_LOST_RECORD = f"instance:lockstep_node_gpus_lost:max{WINDOW}"
