"""The metric vocabulary says what it means: units, RoCE-only names, state labels.

Checked on the declarations (every metric of every built-in collector) and on what the
simulated node really emits (the golden expositions, regenerated from the real collectors).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from lockstep.agent.catalogue import declared
from lockstep.agent.collector import UNITS, MetricSpec
from tests.support import FIXTURES, collected, context
from tests.support import GOLDEN as GOLDEN_DIR

GOLDEN = sorted(GOLDEN_DIR.glob("*.prom"))
SPECS = [spec for specs in declared().values() for spec in specs]

# The metrics with a label named "state", and what their states are.
STATE_LABELS = {
    "lockstep_collector_state": re.compile(r"ok|nothing_here|failed|stuck|never_ran"),
    # Slurm's own node state: a base state with its flags (MIXED+DRAIN), and one series per flag.
    "lockstep_slurm_node_info": re.compile(r"[A-Z_]+(\+[A-Z_]+)*"),
    "lockstep_slurm_node_state": re.compile(r"[a-z_]+"),
    # NVML's GPU fabric registration state (nvmlDeviceGetGpuFabricInfoV).
    "lockstep_gpu_fabric_state": re.compile(r"not_started|in_progress|completed"),
}


def test_every_unit_is_declared_and_ends_the_name() -> None:
    assert len(SPECS) > 100
    for spec in SPECS:
        stem = spec.name.removesuffix("_total")
        named = [unit for unit in UNITS if stem.endswith(f"_{unit}")]
        assert spec.unit == (named[0] if named else ""), spec.name
        if spec.type != "histogram":
            assert spec.family().unit == spec.unit, spec.name  # the metadata reaches the exposition


def test_a_unit_the_name_does_not_carry_is_refused() -> None:
    with pytest.raises(ValueError, match="its name's unit is 'hertz' but it declares 'none'"):
        MetricSpec("lockstep_example_clock_hertz", "gauge", "A clock.")
    with pytest.raises(ValueError, match="its name's unit is 'none' but it declares 'bytes per second'"):
        MetricSpec("lockstep_example_rate", "gauge", "A rate.", unit="bytes per second")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]


def emitted(path: Path) -> list[Sample]:
    """The samples of a golden file (values there may be '<varies>', so only names and labels)."""
    samples = []
    for line in path.read_text().splitlines():
        match = re.match(r"(\w+)(?:\{(.*)\})? ", line)
        if match and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
            samples.append(Sample(match.group(1), labels))
    return samples


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_roce_names_only_on_ethernet_ports(golden: Path) -> None:
    samples = emitted(golden)
    link_layer = {
        (s.labels["device"], s.labels["port"]): s.labels["link_layer"]
        for s in samples
        if s.name == "lockstep_ib_port_info"
    }
    roce = [s for s in samples if s.name.startswith("lockstep_roce_") and "device" in s.labels]
    assert roce, "the simulated node has RoCE ports"
    assert {link_layer[(s.labels["device"], s.labels["port"])] for s in roce} == {"Ethernet"}


def test_roce_counters_of_an_infiniband_port_stay_generic(tmp_path: Path) -> None:
    """mlx5 can list the RoCE congestion counters on an InfiniBand port too: generic (opt-in), not named RoCE."""
    from lockstep.collectors.infiniband import InfinibandCollector, InfinibandOptions

    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "fabric" / "sys", sysfs, symlinks=True)
    ib_port = sysfs / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    assert (ib_port / "link_layer").read_text().strip() == "InfiniBand"
    (ib_port / "hw_counters").mkdir(exist_ok=True)
    (ib_port / "hw_counters" / "np_cnp_sent").write_text("17\n")
    values = collected(
        InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions(hw_stats=("np_*",))))
    )  # generic ones are opt-in
    assert (
        values[
            (
                "lockstep_rdma_hw_stats_total",
                frozenset({"device": "mlx5_0", "port": "1", "counter": "np_cnp_sent"}.items()),
            )
        ]
        == 17
    )
    assert not [k for k in values if k[0].startswith("lockstep_roce_") and ("device", "mlx5_0") in k[1]]


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_a_label_named_state_holds_a_state(golden: Path) -> None:
    for sample in emitted(golden):
        if "state" in sample.labels:
            states = STATE_LABELS.get(sample.name)
            assert states is not None, f"{sample.name} has a 'state' label but is not a state metric"
            assert states.fullmatch(sample.labels["state"]), (sample.name, sample.labels["state"])


def test_only_state_metrics_declare_a_state_label() -> None:
    assert {spec.name for spec in SPECS if "state" in spec.labels} == set(STATE_LABELS)


# Labels a Prometheus scrape sets itself (prometheus-operator's ServiceMonitor targets, static and
# Kubernetes SD configs, external labels): an exposition label of the same name is renamed
# exported_<name> and the query that uses it silently shows the scraper's value.
SCRAPER_LABELS = {"instance", "job", "namespace", "pod", "container", "service", "endpoint", "node", "cluster"}


def test_no_declared_label_is_one_a_scraper_sets() -> None:
    assert {(spec.name, label) for spec in SPECS for label in spec.labels if label in SCRAPER_LABELS} == set()
