"""PCIe alerts: a GPU's, HCA's or NVMe drive's link trained below its maximum width or generation."""

from __future__ import annotations

from alerts.model import Alert, Group
from alerts.promql import WHERE, label, num, on, regex
from lockstep import thresholds as T


def below_maximum(current: str, maximum: str, dimension: str, selector: str = "", indent: str = "") -> str:
    """Links whose current width or generation is below their maximum, with degraded="<dimension>"
    so that a link below both is two alerts, each saying what it lost."""
    lines = ("label_replace(", f"  {current}{selector} < {maximum},", f'  "degraded", "{dimension}", "", ""', ")")
    return "\n".join(indent + line for line in lines)


HCA_KINDS = f'{{kind=~"{regex(T.PCIE_ALERT_KINDS)}"}}'
PCIE_ALERTS = Group(
    "lockstep-pcie.alerts",
    (
        Alert(
            "LockstepPCIeLinkDegraded",
            "warning",
            T.PCIE_DEGRADED_FOR,
            # GPUs only while busy: an idle GPU lowers its link generation (and may lower its width)
            # to save power, which is no fault (thresholds.py).
            "(\n  (\n"
            + below_maximum(
                "lockstep_gpu_pcie_link_width_lanes", "lockstep_gpu_pcie_link_max_width_lanes", "width", indent="    "
            )
            + "\n  or\n"
            + below_maximum(
                "lockstep_gpu_pcie_link_generation",
                "lockstep_gpu_pcie_link_max_generation",
                "generation",
                indent="    ",
            )
            + f"\n  )\n  and {on('uuid')}\n"
            + f"  lockstep_gpu_utilization_ratio >= {num(T.PCIE_GPU_BUSY_UTILIZATION)}\n)\nor\n"
            + below_maximum("lockstep_pcie_link_width_lanes", "lockstep_pcie_link_max_width_lanes", "width", HCA_KINDS)
            + "\nor\n"
            + below_maximum(
                "lockstep_pcie_link_generation", "lockstep_pcie_link_max_generation", "generation", HCA_KINDS
            ),
            "PCIe link of {{ if $labels.uuid }}GPU "
            + label("gpu")
            + "{{ else }}"
            + label("device")
            + "{{ end }} on "
            + WHERE
            + " runs below its maximum "
            + label("degraded"),
            "{{ if $labels.uuid }}GPU "
            + label("gpu")
            + " ("
            + label("uuid")
            + "){{ else }}"
            + label("kind")
            + " device "
            + label("device")
            + "{{ end }} on "
            + WHERE
            + " has run its PCIe link at "
            '{{ if eq $labels.degraded "width" }}x{{ $value }}{{ else }}Gen{{ $value }}{{ end }}, below the '
            "most it and its slot can do, for " + T.PCIE_DEGRADED_FOR + "{{ if $labels.uuid }} while busy{{ end }}: "
            "it trained down (x8 instead of x16, or one generation down, halves the bandwidth), so its "
            "{{ if $labels.uuid }}host-to-device copies{{ else }}GPUDirect RDMA and host traffic{{ end }} slow its job "
            "down. Check the slot, riser and cable; reseat, or reset the device to retrain the link.",
        ),
    ),
)
