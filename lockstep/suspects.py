"""What can make a node slow a job's rank: the straggler rules' suspects, as data.

A straggler alert names the suspect causes its rank's node showed (a hung mount, PFC pauses, an
erring InfiniBand port, ...).  Each suspect is defined here once, as PromQL templates and the
threshold it is judged by, and read by both sides:

- the rules (alerts/straggler_recording.py) render each suspect into the recording
  NODE_SUSPECT{suspect="<name>"} over SUSPECT_WINDOW, which the rank suspects
  (RANK_SUSPECT, NCCL_RANK_SUSPECT) join to the slow ranks, and the alerts' annotations read;
- `lockstep report` (lockstep/report/evidence.py) reads those recorded verdicts for the
  straggler's rank where Prometheus records them, so it names exactly what the alert named; it
  evaluates the same clauses to say *what* it saw (which port, how much), and applies them itself
  only where Prometheus records no rule.

A clause is one way a suspect shows: a PromQL expression of the node's series whose value is
compared with a threshold.  In the expression, SEL stands for the matchers that pick the node's
series (none in the rules, which judge every node; the node's instance in the report) and WIN
for the window, as in the report's event templates (lockstep/report/events.py).  `per_second`:
the value is a rate of seconds (a share of time), which the report divides by its time scale
(the simulated node's speed in the end-to-end tests).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from lockstep import thresholds as T

# The window the suspects are judged over, and the recordings the rules make of them.
SUSPECT_WINDOW = T.STRAGGLER_SUSTAINED_WINDOW
NODE_SUSPECT = f"instance:lockstep_straggler_suspect:active{SUSPECT_WINDOW}"  # by agent (instance)
HOST_SUSPECT = f"host:lockstep_straggler_suspect:active{SUSPECT_WINDOW}"  # by host name
# A slow training rank's suspects (its node's, a throttled GPU of its job there, its data wait).
RANK_SUSPECT = f"job_rank:lockstep_training_suspect:active{SUSPECT_WINDOW}"
# An NCCL straggler's suspects (its node's, a throttled GPU of its job there).
NCCL_RANK_SUSPECT = f"job_comm_rank:lockstep_nccl_suspect:active{SUSPECT_WINDOW}"
# Each GPU's share of time throttled by a slowdown reason, where above SUSPECT_GPU_THROTTLE_SHARE.
GPU_THROTTLE = f"gpu:lockstep_gpu_clock_event_active:avg{SUSPECT_WINDOW}"

COMPARISONS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, "<": operator.lt, "==": operator.eq}


class _Labels(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> str:
        return "?"


def render(template: str, sel: str = "", window: str = SUSPECT_WINDOW) -> str:
    """A template with SEL (matchers, comma-separated, or none) and WIN filled in."""
    if not sel:
        template = template.replace(", SEL}", "}").replace("{SEL}", "")
    return template.replace("SEL", sel).replace("WIN", window)


def number(value: float) -> str:
    """A threshold as PromQL shows it: 0, 4, 0.02 (not 0.0, 4.0)."""
    return str(int(value)) if float(value).is_integer() else repr(value)


@dataclass(frozen=True)
class Clause:
    """One way a suspect shows: `expr` compared by `op` with `threshold`; `says` words one
    series of it for the report (its labels in braces, and {value})."""

    expr: str
    op: str
    threshold: float
    says: str
    per_second: bool = False

    def holds(self, value: float) -> bool:
        return COMPARISONS[self.op](value, self.threshold)

    def say(self, labels: dict[str, str], value: float) -> str:
        """The words for one series of it: its labels ("?" where it has none) and its value."""
        return self.says.format_map(_Labels(labels, value=value))

    def rule(self) -> str:
        """The clause as the rules judge it: every node's series, over SUSPECT_WINDOW."""
        return f"{render(self.expr)} {self.op} {number(self.threshold)}"


@dataclass(frozen=True)
class NodeSuspect:
    """A cause a node shows, by any of its clauses."""

    name: str
    clauses: tuple[Clause, ...]

    def rule(self) -> str:
        """Its recording rule's expression: a sample per series that shows it (the rule groups
        them by node)."""
        return "\n    or ".join(clause.rule() for clause in self.clauses)


def _port_counter(counter: str, what: str) -> Clause:
    return Clause(
        f"increase(lockstep_ib_port_{counter}_total{{SEL}}[WIN])",
        ">",
        0,
        f"IB {{device}}/{{port}}: {{value:.0f}} {what}",
    )


# The transmit wait (in ticks) over the ticks of the port's time sending or waiting to: words
# sent are bytes / 4.
_WAIT = "rate(lockstep_ib_port_transmit_wait_total{SEL}[WIN])"
_SENT = "rate(lockstep_ib_port_transmitted_bytes_total{SEL}[WIN]) / 4"

# In the order the report lists them (the rules render them so too).
NODE_SUSPECTS: tuple[NodeSuspect, ...] = (
    NodeSuspect(
        "pfc_pause",
        (
            Clause(
                "rate(lockstep_pfc_pause_seconds_total{SEL}[WIN])",
                ">",
                T.SUSPECT_PFC_PAUSE_RATIO,
                "PFC pause on {interface} priority {priority} {value:.0%} of the time ({direction})",
                per_second=True,
            ),
        ),
    ),
    NodeSuspect(
        "ib_errors",
        (
            _port_counter("symbol_errors", "symbol errors"),
            _port_counter("link_error_recovery", "link error recoveries"),
            _port_counter("link_downed", "link downs"),
            _port_counter("receive_errors", "receive errors"),
            Clause("min_over_time(lockstep_ib_port_state{SEL}[WIN])", "<", 4, "IB {device}/{port} down"),
        ),
    ),
    NodeSuspect(
        "ib_congestion",
        (
            Clause(
                f"{_WAIT}\n    / ({_WAIT} + {_SENT} > 0)",
                ">",
                T.SUSPECT_IB_TRANSMIT_WAIT_RATIO,
                "IB {device}/{port} congested ({value:.0%} transmit wait)",
            ),
        ),
    ),
    NodeSuspect(
        "hung_mount",
        (
            # Unresponsive at one scrape of the window is enough: a statfs that did not answer
            # within its deadline stalls whatever reads that mount.
            Clause("min_over_time(lockstep_filesystem_responsive{SEL}[WIN])", "==", 0, "mount {mountpoint} hung"),
            Clause(  # a mount's operations together (the counter is a series an RPC operation)
                f"sum by ({', '.join(T.TARGET_LABELS)}, mountpoint) "
                "(increase(lockstep_nfs_major_timeouts_total{SEL}[WIN]))",
                ">",
                0,
                "NFS {mountpoint}: {value:.0f} major timeouts",
            ),
        ),
    ),
    NodeSuspect(
        "cpu_pressure",
        (
            Clause(
                'rate(lockstep_host_pressure_stalled_seconds_total{resource="cpu", kind="some", SEL}[WIN])',
                ">",
                T.SUSPECT_CPU_PRESSURE_RATIO,
                "CPU pressure (some) {value:.0%} of the time",
                per_second=True,
            ),
        ),
    ),
    NodeSuspect(
        "io_pressure",
        (
            Clause(
                'rate(lockstep_host_pressure_stalled_seconds_total{resource="io", kind="full", SEL}[WIN])',
                ">",
                T.SUSPECT_IO_PRESSURE_RATIO,
                "IO pressure (full) {value:.0%} of the time",
                per_second=True,
            ),
        ),
    ),
)
# The fabric's suspects read every port's counters: the rules evaluate them in a group of their own.
FABRIC_SUSPECTS = ("ib_errors", "ib_congestion")

# A slow rank's suspects of its own, beside its node's: a GPU of its job on its node throttled by
# one of these reasons for more than this share of the window ...
GPU_THROTTLE_CLAUSE = Clause(
    'avg_over_time(lockstep_gpu_clock_event_active{reason=~"REASONS", SEL}[WIN])'.replace(
        "REASONS", "|".join(T.SUSPECT_GPU_THROTTLE_REASONS)
    ),
    ">",
    T.SUSPECT_GPU_THROTTLE_SHARE,
    "GPU {gpu} throttled ({reason}) {value:.0%} of the time",
)
# ... and its data wait above its job's median rank's by more than this share of its excess time
# per step (the rank starved by its loader).
DATA_WAIT_SHARE = T.SUSPECT_DATA_WAIT_SHARE
# Every name a rank suspect can have, in the order the report lists them.
RANK_SUSPECT_NAMES = ("gpu_throttle", *(s.name for s in NODE_SUSPECTS), "data_wait")

# What the rank suspects join to: the slow ranks, recorded by the rules wherever they are loaded
# (the report reads their recorded suspects where these exist for the job).
SLOW_RANK_SOURCE = f"job_rank:lockstep_training_work_seconds:ratio_to_median{SUSPECT_WINDOW}"
NCCL_SLOW_RANK_SOURCE = "job_comm_rank:lockstep_nccl_peer_wait:share5m"
