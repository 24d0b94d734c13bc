"""ethtool collector: statistics mapping on captured `ethtool -S` output, and the real ioctl on veth pairs.

Fixture: tests/fixtures/fabric/ethtool/<interface>.stats and .info are `ethtool -S` / `ethtool -i`
output (mlx5 with PFC on priority 3 including the trailing-space storm counter name; mlx5
with 802.3x global pause; i40e), served through the collector's reader interface the way the
simulated node serves its own (the seam ETHTOOL).  The sysfs fixture has the RDMA
netdevs (ens1f0np0 via mlx5_2, eno1 via i40iw0) and MLNX_OFED's ecn/ tree for ens1f0np0.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from lockstep.agent.collector import CollectorContext, NothingHere
from lockstep.agent.config import Overrides, load_config
from lockstep.agent.daemon import Agent, Setup
from lockstep.agent.seams import Seams
from lockstep.agent.webconfig import WebConfig
from lockstep.collectors.ethtool import (
    ETHTOOL,
    DriverInfo,
    EthtoolCollector,
    EthtoolOptions,
    IoctlStatsReader,
    is_per_queue,
)
from tests.support import FIXTURES, REPO, context, lockstep, require_real, samples, wait_until
from tests.support.netns import restore_run_netns, run_netns_state

SYSFS = FIXTURES / "fabric" / "sys"
CAPTURES = FIXTURES / "fabric" / "ethtool"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_ethtool_s(text: str) -> list[tuple[str, int]]:
    """`ethtool -S` output -> [(name as the driver spells it, value)]: ethtool prints each name
    after five spaces of indentation and before ': '."""
    lines = text.splitlines()
    assert lines[0] == "NIC statistics:", lines[0]
    out = []
    for line in lines[1:]:
        name, _, number = line.removeprefix("     ").rpartition(": ")
        out.append((name, int(number)))
    return out


def parse_ethtool_i(text: str) -> DriverInfo:
    fields = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in text.splitlines())
    return DriverInfo(fields["driver"], fields["version"], fields["firmware-version"], fields["bus-info"])


class CapturedReader:
    """The reader interface, answering from captured ethtool output (node_exporter style fixtures)."""

    def __init__(self, directory: Path = CAPTURES) -> None:
        self.directory = directory
        self.closed = False

    def driver_info(self, interface: str) -> DriverInfo:
        return parse_ethtool_i(self._read(interface, "info"))

    def statistics(self, interface: str) -> list[tuple[str, int]]:
        return parse_ethtool_s(self._read(interface, "stats"))

    def _read(self, interface: str, kind: str) -> str:
        path = self.directory / f"{interface}.{kind}"
        if not path.exists():
            raise OSError(errno.ENODEV, f"No such device (SIOCETHTOOL on {interface})")
        return path.read_text()

    def close(self) -> None:
        self.closed = True


def make(sys_: Path = SYSFS, reader: object | None = None, **options: Any) -> EthtoolCollector:
    base = context(sys_=sys_, options=EthtoolOptions(**options))
    ctx = CollectorContext(base.paths, base.options, base.log, Seams(ETHTOOL.replaced_by(reader or CapturedReader())))
    return EthtoolCollector(ctx)


def collect(collector: EthtoolCollector) -> Samples:
    out: Samples = {}
    for family in collector.collect():
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def of(data: Samples, interface: str) -> dict[str, float]:
    """'name{label=value,...}' (labels other than interface, sorted) -> value, for one interface."""
    out = {}
    for (name, labels), value in data.items():
        labels_dict = dict(labels)
        if labels_dict.pop("interface", None) == interface:
            rest = ",".join(f"{k}={v}" for k, v in sorted(labels_dict.items()))
            out[f"{name}{{{rest}}}"] = value
    return out


def test_mlx5_pfc_statistics_on_the_default_rdma_interfaces() -> None:
    data = collect(make())
    assert sorted({dict(labels)["interface"] for _, labels in data}) == ["eno1", "ens1f0np0"]  # the RDMA netdevs
    assert of(data, "ens1f0np0") == {
        "lockstep_pfc_pause_frames_total{direction=rx,priority=3}": 4500,
        "lockstep_pfc_pause_frames_total{direction=tx,priority=3}": 98000,
        "lockstep_pfc_pause_seconds_total{direction=rx,priority=3}": 2.25,  # 2250000 µs
        "lockstep_pfc_pause_seconds_total{direction=tx,priority=3}": 73.5,
        "lockstep_pfc_pause_transitions_total{priority=3}": 4400,
        # "tx_pause_storm_warning_events " (trailing space, as one kernel spells it) still counts.
        "lockstep_pfc_pause_storm_events_total{level=warning}": 3,
        "lockstep_pfc_pause_storm_events_total{level=error}": 0,
        "lockstep_nic_discards_total{direction=rx}": 2048,
        "lockstep_nic_discards_total{direction=tx}": 5,
        "lockstep_nic_out_of_buffer_drops_total{}": 17,
        "lockstep_nic_fec_corrected_bit_errors_total{}": 123456,
        "lockstep_nic_phy_received_bytes_total{}": 100000000000000,  # rx_bits_phy / 8
        "lockstep_nic_crc_errors_total{}": 0,
        "lockstep_nic_symbol_errors_total{}": 0,
        "lockstep_nic_link_down_events_total{}": 2,
        "lockstep_nic_info{bus_info=0000:3b:00.0,driver=mlx5_core,driver_version=5.15.0-105-generic,"
        "firmware_version=22.36.1010 (MT_0000000359)}": 1,
        **{f"lockstep_roce_dcqcn_enabled{{priority={p},role={role}}}": float(p == 3) for p in range(8) for role in (
            "notification_point", "reaction_point")},
    }  # fmt: skip
    # No MLNX_OFED ecn/ tree, no PFC statistics: only what the i40e driver has that we name.
    assert of(data, "eno1") == {
        "lockstep_nic_info{bus_info=0000:18:00.0,driver=i40e,driver_version=2.22.18,"
        "firmware_version=9.20 0x8000d95e 1.3353.0}": 1,
    }


def test_global_pause_and_interface_patterns() -> None:
    data = collect(make(interfaces_include=("ens*",), interfaces_exclude=("eno*",)))
    assert sorted({dict(labels)["interface"] for _, labels in data}) == ["ens1f0np0", "ens1f1np1"]
    pause = {k: v for k, v in of(data, "ens1f1np1").items() if k.startswith("lockstep_pfc_")}
    assert pause == {
        "lockstep_pfc_pause_frames_total{direction=rx,priority=global}": 10,
        "lockstep_pfc_pause_frames_total{direction=tx,priority=global}": 20,
        "lockstep_pfc_pause_seconds_total{direction=rx,priority=global}": 0.0005,
        "lockstep_pfc_pause_seconds_total{direction=tx,priority=global}": 0.0015,
        "lockstep_pfc_pause_transitions_total{priority=global}": 9,
    }


def test_chosen_statistics_without_and_with_per_queue() -> None:
    data = collect(make(statistics=("rx*packets*", "ch*")))
    chosen = {k: v for k, v in of(data, "ens1f0np0").items() if k.startswith("lockstep_ethtool_statistic")}
    assert chosen == {
        "lockstep_ethtool_statistic{statistic=rx_packets}": 9876543210,
        "lockstep_ethtool_statistic{statistic=rx_packets_phy}": 9876545000,
    }
    data = collect(make(statistics=("rx*packets*", "ch*"), per_queue=True))
    chosen = {k: v for k, v in of(data, "ens1f0np0").items() if k.startswith("lockstep_ethtool_statistic")}
    assert chosen == {
        "lockstep_ethtool_statistic{statistic=rx_packets}": 9876543210,
        "lockstep_ethtool_statistic{statistic=rx0_packets}": 4938271605,
        "lockstep_ethtool_statistic{statistic=ch0_events}": 1234567,
        "lockstep_ethtool_statistic{statistic=rx_packets_phy}": 9876545000,
    }


def test_names_are_read_again_every_round(tmp_path: Path) -> None:
    """mlx5 swaps rx_global_pause* for rx_prio<N>_pause* when PFC gets enabled."""
    shutil.copy(CAPTURES / "ens1f0np0.info", tmp_path)
    (tmp_path / "ens1f0np0.stats").write_text("NIC statistics:\n     rx_global_pause: 10\n     tx_global_pause: 4\n")
    collector = make(reader=CapturedReader(tmp_path), interfaces_exclude=("eno1",))
    frames = lambda data: {k: v for k, v in of(data, "ens1f0np0").items() if "pause_frames" in k}  # noqa: E731
    assert frames(collect(collector)) == {
        "lockstep_pfc_pause_frames_total{direction=rx,priority=global}": 10,
        "lockstep_pfc_pause_frames_total{direction=tx,priority=global}": 4,
    }
    (tmp_path / "ens1f0np0.stats").write_text(
        "NIC statistics:\n     rx_prio3_pause: 7\n     rx_prio4_pause: 1\n     tx_prio3_pause: 2\n"
    )
    assert frames(collect(collector)) == {
        "lockstep_pfc_pause_frames_total{direction=rx,priority=3}": 7,
        "lockstep_pfc_pause_frames_total{direction=rx,priority=4}": 1,
        "lockstep_pfc_pause_frames_total{direction=tx,priority=3}": 2,
    }


def test_an_interface_that_cannot_be_read_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    class Failing(CapturedReader):
        def statistics(self, interface: str) -> list[tuple[str, int]]:
            if interface == "eno1":
                raise OSError(errno.EOPNOTSUPP, "Operation not supported (SIOCETHTOOL on eno1)")
            return super().statistics(interface)

    collector = make(reader=Failing())
    for _ in range(2):
        data = collect(collector)
        assert sorted({dict(labels)["interface"] for _, labels in data}) == ["ens1f0np0"]
    warnings = [r for r in caplog.records if r.msg == "cannot read the interface's statistics"]
    assert [(r.interface, r.reason) for r in warnings] == [("eno1", "Operation not supported (SIOCETHTOOL on eno1)")]  # type: ignore[attr-defined]


def test_nothing_here_without_rdma_interfaces(tmp_path: Path) -> None:
    with pytest.raises(NothingHere, match="no RDMA network interfaces .* and none matched by interfaces_include"):
        collect(make(sys_=tmp_path))


def test_interfaces_of_another_network_namespace_are_nothing_here(tmp_path: Path) -> None:
    """sysfs (mounted from the host) lists an RDMA netdev the agent's namespace does not have: the
    real ioctl says ENODEV, and the collector says why in words."""
    port = tmp_path / "class" / "infiniband" / "rxe0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs" / "0").write_text("lsnosuch0\n")
    collector = EthtoolCollector(context(sys_=tmp_path, options=EthtoolOptions()))  # no fake: the real SIOCETHTOOL
    try:
        with pytest.raises(NothingHere, match=r"no network interface lsnosuch0 in the agent's network namespace"):
            collect(collector)
    finally:
        collector.close()


def test_close_closes_the_reader() -> None:
    reader = CapturedReader()
    make(reader=reader).close()
    assert reader.closed


@pytest.mark.parametrize(
    ("name", "per_queue"),
    [
        ("rx0_packets", True),
        ("tx15_bytes", True),
        ("ch3_events", True),
        ("ptp_cq0_cqe", True),
        ("rx_queue_0_xdp_packets", True),  # veth, virtio
        ("tx_queue_12_packets", True),  # ice
        ("tx-0.packets", True),  # i40e
        ("[3]: rx_ucast_packets", True),  # bnxt
        ("rx_prio3_pause", False),
        ("rx_prio3_discards", False),
        ("rx_err_lane_0_phy", False),
        ("tx_pause_storm_warning_events", False),
        ("rx_packets", False),
        ("peer_ifindex", False),
    ],
)
def test_per_queue_names(name: str, per_queue: bool) -> None:
    assert is_per_queue(name) is per_queue


# --- the real kernel ---


@pytest.fixture
def netns_veth() -> tuple[str, str]:
    """A veth pair inside a network namespace made for the test: (namespace, interface)."""
    require_real("root and iproute2 (ip netns, veth)", os.geteuid() == 0 and shutil.which("ip") is not None)
    require_real("ethtool (Debian package ethtool)", shutil.which("ethtool") is not None)
    namespace = "lockstep-" + uuid.uuid4().hex[:8]
    run_netns = run_netns_state()
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        ns = ["ip", "netns", "exec", namespace]
        subprocess.run([*ns, "ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"], check=True)
        for interface in ("veth0", "veth1", "lo"):
            subprocess.run([*ns, "ip", "link", "set", interface, "up"], check=True)
        yield namespace, "veth0"  # type: ignore[misc]
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        restore_run_netns(run_netns)


@pytest.mark.machine
def test_ioctl_reader_equals_ethtool_in_a_network_namespace(netns_veth: tuple[str, str]) -> None:
    namespace, interface = netns_veth
    ns = ["ip", "netns", "exec", namespace]
    script = (
        "import json, sys; from lockstep.collectors.ethtool import IoctlStatsReader; r = IoctlStatsReader(); "
        "i = r.driver_info(sys.argv[1]); "
        "print(json.dumps([[i.driver, i.version, i.firmware_version, i.bus_info], r.statistics(sys.argv[1])]))"
    )
    ours = subprocess.run([*ns, sys.executable, "-c", script, interface], capture_output=True, text=True, cwd=REPO)
    assert ours.returncode == 0, ours.stderr
    info, stats = json.loads(ours.stdout)
    ethtool_s = subprocess.run([*ns, "ethtool", "-S", interface], capture_output=True, text=True, check=True)
    ethtool_i = subprocess.run([*ns, "ethtool", "-i", interface], capture_output=True, text=True, check=True)
    assert [tuple(pair) for pair in stats] == parse_ethtool_s(ethtool_s.stdout)
    assert DriverInfo(*info) == parse_ethtool_i(ethtool_i.stdout)
    assert DriverInfo(*info).driver == "veth"
    peer_ifindex = int(subprocess.run([*ns, "cat", "/sys/class/net/veth1/ifindex"], capture_output=True).stdout)
    assert dict(parse_ethtool_s(ethtool_s.stdout))["peer_ifindex"] == peer_ifindex


@pytest.mark.machine
def test_lockstep_once_in_a_network_namespace_matches_ethtool(netns_veth: tuple[str, str], tmp_path: Path) -> None:
    """The whole agent in the namespace (`ip netns exec` also mounts the namespace's sysfs), every
    statistic chosen, per-queue ones included: exactly what `ethtool -S` prints."""
    namespace, interface = netns_veth
    config = tmp_path / "lockstep.yml"
    config.write_text(f"collectors:\n  ethtool:\n    interfaces_include: [{interface}]\n    per_queue: true\n")
    ns = ["ip", "netns", "exec", namespace]
    args = ["once", "--config", str(config), "--collector.disable-defaults", "--collector.ethtool"]
    result = subprocess.run(
        [*ns, sys.executable, "-m", "lockstep.agent.cli", *args, "--ethtool.statistic", "*"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    ethtool_s = subprocess.run([*ns, "ethtool", "-S", interface], capture_output=True, text=True, check=True)
    exported = {
        dict(labels)["statistic"]: value
        for (name, labels), value in samples(result.stdout).items()
        if name == "lockstep_ethtool_statistic"
    }
    assert exported == dict(parse_ethtool_s(ethtool_s.stdout))
    assert samples(result.stdout)[
        ("lockstep_nic_info", frozenset({"interface": interface, "driver": "veth", "driver_version": "1.0",
                                         "firmware_version": "", "bus_info": ""}.items()))
    ] == 1  # fmt: skip


@pytest.mark.machine
def test_veth_created_and_deleted_appears_and_disappears(tmp_path: Path) -> None:
    """Real kernel uevents: the agent reruns the collector at once (its interval is an hour), and the
    new interface's series appear; after deletion they are gone from the next snapshot."""
    require_real("root and iproute2 (to create a veth pair)", os.geteuid() == 0 and shutil.which("ip") is not None)
    name = "lse" + uuid.uuid4().hex[:8]
    config = tmp_path / "lockstep.yml"
    config.write_text(f"collectors:\n  ethtool:\n    interval: 1h\n    interfaces_include: ['{name}*']\n")
    available = {"ethtool": EthtoolCollector}
    setup = Setup(config, available, Overrides(disable_defaults=True, enable=frozenset({"ethtool"})), Seams())
    agent = Agent(setup, load_config(config, available, setup.overrides), WebConfig())

    def interfaces() -> set[str]:
        body, _ = agent.exporter.render()
        return {
            dict(labels)["interface"] for (metric, labels) in samples(body.decode()) if metric == "lockstep_nic_info"
        }

    try:
        assert agent.hotplug is not None and agent.hotplug.subsystems == {"infiniband", "net"}
        wait_until(lambda: agent.workers["ethtool"].view().runs_total == 1, what="the first run")
        assert interfaces() == set()
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
        wait_until(lambda: interfaces() == {name, name + "p"}, what="the new veth pair's series")
        subprocess.run(["ip", "link", "del", name], check=True)
        wait_until(lambda: interfaces() == set(), what="the deleted veth pair's series to go")
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        agent.stop()


def test_ioctl_reader_errors_name_the_interface() -> None:
    reader = IoctlStatsReader()
    try:
        with pytest.raises(OSError, match=r"No such device \(SIOCETHTOOL on lsnosuch0\)") as raised:
            reader.statistics("lsnosuch0")
        assert raised.value.errno == errno.ENODEV
        with pytest.raises(OSError, match="not an interface name"):
            reader.driver_info("a-name-longer-than-15")
    finally:
        reader.close()


@pytest.mark.real
def test_flags_in_help() -> None:
    result = lockstep("once", "--help")
    assert "--ethtool.interface-include" in result.stdout
    assert "--ethtool.interface-exclude" in result.stdout
    assert "--ethtool.statistic" in result.stdout
