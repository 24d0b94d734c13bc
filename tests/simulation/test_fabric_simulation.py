"""The simulated fabric over time: the scenarios move the counters they are about, and only those."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from lockstep.agent.collector import Collector, CollectorContext
from lockstep.agent.config import Overrides, load_config
from lockstep.collectors.ethtool import EthtoolCollector
from lockstep.collectors.infiniband import InfinibandCollector
from lockstep.simulation import SimulatedNode, temporary_node


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Iterator[SimulatedNode]:
    simulated, directory = temporary_node(request.param)
    with directory:
        yield simulated


def at(node: SimulatedNode, cls: type[Collector], t: float) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    node.render(t)
    # The node's options for the collector, parsed as the demo's are (YAML-like values -> its options dataclass).
    options = load_config(None, {cls.name: cls}, Overrides(options=node.options)).collectors[cls.name].options
    collector = cls(CollectorContext(node.paths, options, logging.getLogger("test"), node.seams))
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in collector.collect()
        for sample in family.samples
    }


def port(name: str, device: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset({"device": device, "port": "1"}.items()))


@pytest.mark.parametrize("node", ["link-flap"], indirect=True)
def test_link_flap_moves_one_port(node: SimulatedNode) -> None:
    before, after = at(node, InfinibandCollector, 0), at(node, InfinibandCollector, 60)
    assert (
        after[port("lockstep_ib_port_link_downed_total", "mlx5_3")]
        - before[port("lockstep_ib_port_link_downed_total", "mlx5_3")]
        == 1
    )
    assert (
        after[port("lockstep_ib_port_link_error_recovery_total", "mlx5_3")]
        - before[port("lockstep_ib_port_link_error_recovery_total", "mlx5_3")]
        == 3
    )
    assert after[port("lockstep_ib_port_link_downed_total", "mlx5_2")] == 0
    saturated = {dict(labels)["device"] for (name, labels) in after if name == "lockstep_ib_port_saturated"}
    assert saturated == {"mlx5_3"}
    down = at(node, InfinibandCollector, 55)
    assert down[port("lockstep_ib_port_state", "mlx5_3")] == 1  # DOWN, 10 s of every minute
    assert down[port("lockstep_ib_port_physical_state", "mlx5_3")] == 2  # Polling
    assert down[port("lockstep_ib_port_state", "mlx5_2")] == 4


@pytest.mark.parametrize("node", ["pfc-storm"], indirect=True)
def test_pfc_storm_pauses_one_priority(node: SimulatedNode) -> None:
    before, after = at(node, EthtoolCollector, 0), at(node, EthtoolCollector, 10)

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after[key] - before[key]

    tx3 = {"interface": "ens3f0np0", "priority": "3", "direction": "tx"}
    assert delta("lockstep_pfc_pause_seconds_total", **tx3) == pytest.approx(8.5 + 10 * 20e-6)  # 85 % paused
    assert delta("lockstep_pfc_pause_frames_total", **tx3) == 150_000 + 10
    assert delta("lockstep_pfc_pause_storm_events_total", interface="ens3f0np0", level="warning") == 1
    assert delta("lockstep_pfc_pause_storm_events_total", interface="ens3f0np0", level="error") == 0
    other = {"interface": "ens3f1np1", "priority": "global", "direction": "tx"}
    assert delta("lockstep_pfc_pause_seconds_total", **other) == pytest.approx(10 * 20e-6)


@pytest.mark.parametrize("node", ["healthy"], indirect=True)
def test_healthy_fabric(node: SimulatedNode) -> None:
    ib = at(node, InfinibandCollector, 0)
    assert sum(1 for (name, _) in ib if name == "lockstep_ib_port_info") == 10
    assert not any(name == "lockstep_ib_port_saturated" for (name, _) in ib)
    roce = {dict(labels)["netdev"] for (name, labels) in ib if name == "lockstep_ib_port_info"} - {""}
    assert roce == {"ens3f0np0", "ens3f1np1"}
    assert at(node, InfinibandCollector, 30) == at(node, InfinibandCollector, 30)  # a pure function of t
