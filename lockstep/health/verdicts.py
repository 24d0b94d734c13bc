"""What makes a node unhealthy, judged on one exposition of the agent.

Each verdict reads series the agent already exports, at one moment, and names what it found in a
line short enough for `sinfo -R` and node-problem-detector (at most HEALTH_REASON_CHARACTERS with
the others counted).  The list is short on purpose: a health check drains nodes, so only what
needs a repair or a reset is here; what slows a job (a throttled GPU, a congested port) is for
the alerts and the report.  A verdict whose collector failed, is stuck or has not run yet cannot
be judged: it is *undecided*, and a node with nothing else wrong is then of unknown health, never
healthy.  A collector that is not enabled, or found nothing to collect, leaves its verdicts
nothing to judge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from lockstep import thresholds as T

Labels = dict[str, str]


@dataclass(frozen=True)
class Verdict:
    name: str
    collector: str  # the collector whose series it reads
    what: str  # for docs/health-check.md and --help


VERDICTS = (
    Verdict("gpu_lost", "gpu", "a GPU fell off the bus (NVML: GPU is lost), or NVML stopped answering"),
    Verdict("gpu_recovery_action", "gpu", "NVML's recovery action for a GPU is not none (a reset, a reboot, a drain)"),
    Verdict("gpu_xid", "gpu", "an XID needing a reset or reboot (HEALTH_RESET_XIDS) since the agent started"),
    Verdict("gpu_row_remap_failed", "gpu", "a row remapping failed: the GPU has no spare memory rows left"),
    Verdict("gpu_row_remap_pending", "gpu", "a row remapping is pending: the GPU needs a reset to apply it"),
    Verdict("ib_port_down", "infiniband", "an InfiniBand/RDMA port is not ACTIVE and not administratively disabled"),
    Verdict("ib_port_degraded", "infiniband", "a port's rate is below the fastest port of its link layer on the node"),
    Verdict("hca_pcie_degraded", "pcie", "an HCA's PCIe link trained below its maximum width or generation"),
    Verdict("filesystem_hung", "filesystem", "a mount's statfs does not answer (its NFS/Lustre server or FUSE daemon)"),
    # From Prometheus (--prometheus), not the agent: the node's record across jobs (alerts/nodes.py).
    Verdict(
        "repeat_offender",
        "",
        "the straggler or hang alerts (or stalled saves) of NODE_JOBS_HURT or more jobs named it in 7 days",
    ),
)  # fmt: skip
JUDGED_COLLECTORS = tuple(dict.fromkeys(v.collector for v in VERDICTS if v.collector))
IB_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 5: "ACTIVE_DEFER"}


@dataclass(frozen=True)
class Finding:
    verdict: str
    reason: str


@dataclass
class Judgement:
    findings: list[Finding] = field(default_factory=list)  # in VERDICTS' order
    undecided: list[str] = field(default_factory=list)  # what could not be judged, and why
    checked: list[str] = field(default_factory=list)  # what was judged ("8 GPUs"), for the healthy line


class Exposition:
    """The samples of one exposition by name: name -> [(labels, value)]."""

    def __init__(self, text: str) -> None:
        """ValueError (with the parser's words) when the text is not the Prometheus text format."""
        self.samples: dict[str, list[tuple[Labels, float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    self.samples[sample.name].append((dict(sample.labels), float(sample.value)))
        except ValueError as exc:
            raise ValueError(f"{_first_bad_line(text)}: {exc}") from None

    def get(self, name: str, **match: str) -> list[tuple[Labels, float]]:
        return [
            (labels, v) for labels, v in self.samples.get(name, []) if all(labels.get(k) == w for k, w in match.items())
        ]

    def value(self, name: str, **match: str) -> float | None:
        found = self.get(name, **match)
        return found[0][1] if found else None


def _first_bad_line(text: str) -> str:
    """Where the parser stopped: the first line it refuses alone (the parser does not say)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            try:
                list(text_string_to_metric_families(line + "\n"))
            except ValueError:
                return f"line {number}"
    return "a line"


def _gpu_order(labels: Labels) -> tuple[int, str]:
    gpu = labels.get("gpu", "")
    return (int(gpu) if gpu.isdigit() else 1 << 30, gpu)


def _by_gpu(samples: Iterable[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
    return sorted(samples, key=lambda s: _gpu_order(s[0]))


def _by_device(samples: Iterable[tuple[Labels, float]]) -> list[tuple[Labels, float]]:
    return sorted(samples, key=lambda s: (s[0].get("device", ""), s[0].get("port", ""), s[0].get("mountpoint", "")))


def collector_states(exposition: Exposition) -> dict[str, str]:
    return {
        labels["collector"]: labels.get("state", "")
        for labels, v in exposition.get("lockstep_collector_state")
        if v == 1
    }


def judge(exposition: Exposition) -> Judgement:
    """Every verdict on the exposition."""
    judgement = Judgement()
    states = collector_states(exposition)
    found = judgement.findings

    # A collector that cannot answer leaves its verdicts undecided; the GPU collector stuck in NVML
    # is itself a verdict: NVML hangs after a GPU fault (as LockstepGPUFellOffBus reads it).
    for collector in JUDGED_COLLECTORS:
        state = states.get(collector)
        if collector == "gpu" and state == "stuck":
            stuck_for = exposition.value("lockstep_collector_duration_seconds", collector="gpu") or 0.0
            found.append(Finding("gpu_lost", f"NVML not answering for {stuck_for:.0f}s (GPU collector stuck)"))
        elif state in ("failed", "stuck", "never_ran"):
            word = {"failed": "failed", "stuck": "is stuck", "never_ran": "has not run yet"}[state]
            judgement.undecided.append(f"the {collector} collector {word}: its verdicts undecided")

    for labels, up in _by_gpu(exposition.get("lockstep_gpu_up")):
        if up == 0:
            found.append(Finding("gpu_lost", f"GPU {labels.get('gpu')} lost (fell off the bus)"))
    for labels, v in _by_gpu(exposition.get("lockstep_gpu_recovery_action")):
        if v == 1 and labels.get("action") != "none":
            action = labels.get("action", "").replace("_", " ")
            found.append(
                Finding("gpu_recovery_action", f"GPU {labels.get('gpu')} needs {action} (NVML recovery action)")
            )
    reset_xids = {str(x) for x in T.HEALTH_RESET_XIDS}
    for labels, n in _by_gpu(exposition.get("lockstep_gpu_xid_errors_total")):
        if labels.get("xid") in reset_xids and n > 0:
            found.append(
                Finding("gpu_xid", f"GPU {labels.get('gpu')} XID {labels.get('xid')} ({n:.0f}x): needs a reset")
            )
    for labels, v in _by_gpu(exposition.get("lockstep_gpu_row_remapping_failed")):
        if v == 1:
            found.append(Finding("gpu_row_remap_failed", f"GPU {labels.get('gpu')} row remapping failed: replace it"))
    for labels, v in _by_gpu(exposition.get("lockstep_gpu_row_remapping_pending")):
        if v == 1:
            found.append(Finding("gpu_row_remap_pending", f"GPU {labels.get('gpu')} row remapping pending: reset it"))

    physical = {(lb.get("device"), lb.get("port")): v for lb, v in exposition.get("lockstep_ib_port_physical_state")}
    for labels, logical in _by_device(exposition.get("lockstep_ib_port_state")):
        port = (labels.get("device"), labels.get("port"))
        if logical != T.IB_PORT_ACTIVE and physical.get(port) != T.IB_PORT_PHYSICAL_DISABLED:
            name = IB_STATES.get(int(logical), str(int(logical)))
            found.append(Finding("ib_port_down", f"IB port {port[0]}/{port[1]} down ({name})"))
    link_layer = {
        (lb.get("device"), lb.get("port")): lb.get("link_layer", "")
        for lb, _ in exposition.get("lockstep_ib_port_info")
    }
    active = {
        (lb.get("device"), lb.get("port"))
        for lb, v in exposition.get("lockstep_ib_port_state")
        if v == T.IB_PORT_ACTIVE
    }
    rates = [
        (lb, v)
        for lb, v in exposition.get("lockstep_ib_port_rate_bytes_per_second")
        if v > 0 and (lb.get("device"), lb.get("port")) in active  # a port down is ib_port_down's
    ]
    fastest: dict[str, float] = {}
    for labels, rate in rates:
        layer = link_layer.get((labels.get("device"), labels.get("port")), "")
        fastest[layer] = max(fastest.get(layer, 0.0), rate)
    for labels, rate in _by_device(rates):
        layer = link_layer.get((labels.get("device"), labels.get("port")), "")
        if rate < fastest[layer]:
            found.append(
                Finding(
                    "ib_port_degraded",
                    f"IB port {labels.get('device')}/{labels.get('port')} at {rate * 8 / 1e9:g} Gb/s, "
                    f"others {fastest[layer] * 8 / 1e9:g}",
                )
            )

    hca = {"kind": "infiniband"}
    for current, maximum, unit in (
        ("lockstep_pcie_link_width_lanes", "lockstep_pcie_link_max_width_lanes", "x{:.0f}"),
        ("lockstep_pcie_link_generation", "lockstep_pcie_link_max_generation", "Gen{:.0f}"),
    ):
        most = {lb.get("device"): v for lb, v in exposition.get(maximum, **hca)}
        for labels, v in _by_device(exposition.get(current, **hca)):
            top = most.get(labels.get("device"))
            if top is not None and v < top:
                shown = f"{unit.format(v)}, most {unit.format(top)}"
                found.append(Finding("hca_pcie_degraded", f"HCA {labels.get('device')} PCIe at {shown}"))

    for labels, v in _by_device(exposition.get("lockstep_filesystem_responsive")):
        if v == 0:
            found.append(
                Finding("filesystem_hung", f"mount {labels.get('mountpoint')} ({labels.get('fstype')}) not answering")
            )

    order = {v.name: i for i, v in enumerate(VERDICTS)}
    found.sort(key=lambda f: order[f.verdict])  # stable: within a verdict, the order above
    counts = (
        ("GPU", len(exposition.get("lockstep_gpu_up"))),
        ("IB port", len(exposition.get("lockstep_ib_port_state"))),
        ("mount", len(exposition.get("lockstep_filesystem_responsive"))),
    )
    judgement.checked = [f"{n} {what}{'s' if n != 1 else ''}" for what, n in counts if n]
    return judgement
