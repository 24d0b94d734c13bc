"""InfiniBand collector on fixture trees built from the fabric counter reference, and on real kernel errnos.

tests/fixtures/fabric/sys/class/infiniband holds:
- mlx4_0: legacy PMA (32-bit data in counters/, 64-bit in counters_ext/), port_xmit_wait pegged at 2**32-1;
- mlx5_0: InfiniBand port with extended counters and hw_counters;
- i40iw0: iWARP, every PMA counter reads "N/A (no PMA)", netdev found through device/net;
- mlx5_2: RoCE port (link layer Ethernet) with its netdev in gid_attrs/ndevs/0 and congestion hw_counters;
- hfi1_0: OmniPath, no hca_type, driver-specific hw_counters.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockstep.agent.collector import NothingHere
from lockstep.agent.config import Overrides, load_config
from lockstep.agent.daemon import Agent, Setup
from lockstep.agent.seams import Seams
from lockstep.agent.webconfig import WebConfig
from lockstep.collectors.infiniband import InfinibandCollector, InfinibandOptions
from lockstep.collectors.infiniband.sysfs import parse_rate, parse_state
from lockstep.collectors.toolkit.sysfs import rdma_netdevs
from tests.support import (
    FIXTURES,
    GENERATED,
    REPO,
    AgentProcess,
    collected,
    collector_up,
    context,
    require_real,
    samples,
    wait_until,
)

SYSFS = FIXTURES / "fabric" / "sys"
PROC = FIXTURES / "host" / "proc"
MLX5_COUNTERS = Path("class/infiniband/mlx5_0/ports/1/counters")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def collect(collector: InfinibandCollector) -> Samples:
    out: Samples = {}
    for family in collector.collect():
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def port_values(samples: Samples, device: str, port: str = "1") -> dict[str, float]:
    """name (with the 'counter' label appended for per-counter metrics) -> value, for one port."""
    out = {}
    for (name, labels), value in samples.items():
        labels_dict = dict(labels)
        if labels_dict.get("device") == device and labels_dict.get("port") == port:
            key = f"{name}[{labels_dict['counter']}]" if "counter" in labels_dict else name
            if name != "lockstep_ib_port_info":
                out[key] = value
    return out


def info(samples: Samples, device: str) -> dict[str, str]:
    for (name, labels), _ in samples.items():
        if name == "lockstep_ib_port_info" and dict(labels)["device"] == device:
            return dict(labels)
    raise AssertionError(f"no info series for {device}")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of the fixture sysfs."""
    shutil.copytree(SYSFS, tmp_path / "sys", symlinks=True)
    return tmp_path / "sys"


def test_legacy_mlx4_port_uses_counters_ext_and_flags_the_pegged_counter() -> None:
    samples = collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions())))
    assert port_values(samples, "mlx4_0") == {
        "lockstep_ib_port_state": 4,
        "lockstep_ib_port_physical_state": 5,
        "lockstep_ib_port_rate_bytes_per_second": 5e9,  # 40 Gb/sec
        # counters_ext/ 64-bit values, data words × 4; the pegged 32-bit counters/ copies are not used.
        "lockstep_ib_port_transmitted_bytes_total": 918273645546 * 4,
        "lockstep_ib_port_received_bytes_total": 817263544536 * 4,
        "lockstep_ib_port_transmitted_packets_total": 1234567890,
        "lockstep_ib_port_received_packets_total": 1134567890,
        "lockstep_ib_port_unicast_transmitted_packets_total": 1234000000,
        "lockstep_ib_port_unicast_received_packets_total": 1134000000,
        "lockstep_ib_port_multicast_transmitted_packets_total": 567890,
        "lockstep_ib_port_multicast_received_packets_total": 467890,
        "lockstep_ib_port_symbol_errors_total": 7,
        "lockstep_ib_port_link_downed_total": 1,
        "lockstep_ib_port_link_error_recovery_total": 0,
        "lockstep_ib_port_transmit_wait_total": 4294967295,
        "lockstep_ib_port_transmit_discards_total": 12,
        "lockstep_ib_port_receive_errors_total": 3,
        "lockstep_ib_port_receive_remote_physical_errors_total": 0,
        "lockstep_ib_port_receive_switch_relay_errors_total": 0,
        "lockstep_ib_port_transmit_constraint_errors_total": 0,
        "lockstep_ib_port_receive_constraint_errors_total": 0,
        "lockstep_ib_port_local_link_integrity_errors_total": 0,
        "lockstep_ib_port_excessive_buffer_overrun_errors_total": 0,
        "lockstep_ib_port_vl15_dropped_total": 0,
        "lockstep_ib_port_saturated[port_xmit_wait]": 1,
        "lockstep_ib_port_unparseable_values_total": 0,
    }
    assert info(samples, "mlx4_0") == {
        "device": "mlx4_0",
        "port": "1",
        "link_layer": "InfiniBand",
        "netdev": "",
        "node_guid": "0002:c903:00a1:b2c0",
        "firmware_version": "2.42.5000",
        "board_id": "MT_1090120019",
        "hca_type": "MT4099",
        "rate": "40 Gb/sec (4X QDR)",
    }
    # Only the pegged counter is flagged, on the whole tree.
    saturated = [dict(labels) for (name, labels) in samples if name == "lockstep_ib_port_saturated"]
    assert saturated == [{"device": "mlx4_0", "port": "1", "counter": "port_xmit_wait"}]


def test_mlx5_infiniband_port_with_hw_counters() -> None:
    samples = collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions(hw_stats=("*",)))))
    values = port_values(samples, "mlx5_0")
    assert values["lockstep_ib_port_rate_bytes_per_second"] == 25e9  # 200 Gb/sec (4X HDR)
    assert values["lockstep_ib_port_transmitted_bytes_total"] == 91231548412 * 4
    assert values["lockstep_ib_port_received_bytes_total"] == 73521548219 * 4
    assert values["lockstep_ib_port_transmit_wait_total"] == 28441
    assert values["lockstep_ib_port_link_error_recovery_total"] == 2
    hw = {k: v for k, v in values.items() if k.startswith(("lockstep_roce_", "lockstep_rdma_"))}
    assert hw == {
        "lockstep_rdma_out_of_sequence_total": 4,
        "lockstep_rdma_packet_sequence_errors_total": 2,
        "lockstep_rdma_local_ack_timeouts_total": 3,
        "lockstep_rdma_duplicate_requests_total": 1,
        "lockstep_rdma_implied_nak_sequence_errors_total": 0,
        "lockstep_rdma_rnr_naks_received_total": 0,
        "lockstep_rdma_out_of_buffer_drops_total": 0,
        "lockstep_rdma_transport_retries_exceeded_total": 0,
        "lockstep_rdma_rnr_retries_exceeded_total": 0,
        # Everything without a dedicated name, by its file name; lifespan is a setting, not exported.
        "lockstep_rdma_hw_stats_total[rx_write_requests]": 40211,
        "lockstep_rdma_hw_stats_total[rx_read_requests]": 1882,
        "lockstep_rdma_hw_stats_total[rx_atomic_requests]": 0,
        "lockstep_rdma_hw_stats_total[rx_dct_connect]": 0,
        "lockstep_rdma_hw_stats_total[resp_local_length_error]": 0,
        "lockstep_rdma_hw_stats_total[resp_cqe_error]": 0,
        "lockstep_rdma_hw_stats_total[req_cqe_error]": 0,
        "lockstep_rdma_hw_stats_total[req_remote_invalid_request]": 0,
        "lockstep_rdma_hw_stats_total[req_remote_access_errors]": 0,
        "lockstep_rdma_hw_stats_total[resp_remote_access_errors]": 0,
        "lockstep_rdma_hw_stats_total[resp_cqe_flush_error]": 0,
        "lockstep_rdma_hw_stats_total[req_cqe_flush_error]": 0,
    }
    assert "lockstep_ib_port_saturated[port_xmit_wait]" not in values


def test_generic_hw_counters_only_those_the_hw_stats_option_names() -> None:
    """13 series a port that no rule or dashboard reads: off by default (docs/fabric.md)."""
    default = port_values(collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions()))), "mlx5_0")
    assert [k for k in default if k.startswith("lockstep_rdma_hw_stats_total")] == []
    assert default["lockstep_rdma_out_of_sequence_total"] == 4  # the dedicated ones stay
    chosen = port_values(
        collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions(hw_stats=("rx_*_requests",))))),
        "mlx5_0",
    )
    assert {k: v for k, v in chosen.items() if k.startswith("lockstep_rdma_hw_stats_total")} == {
        "lockstep_rdma_hw_stats_total[rx_write_requests]": 40211,
        "lockstep_rdma_hw_stats_total[rx_read_requests]": 1882,
        "lockstep_rdma_hw_stats_total[rx_atomic_requests]": 0,
    }


def test_iwarp_port_with_no_pma_reports_everything_else() -> None:
    samples = collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions())))
    assert port_values(samples, "i40iw0") == {
        "lockstep_ib_port_state": 4,
        "lockstep_ib_port_physical_state": 5,
        "lockstep_ib_port_rate_bytes_per_second": 1.25e9,
        "lockstep_ib_port_unparseable_values_total": 0,  # "N/A (no PMA)" is not an error
    }
    assert info(samples, "i40iw0")["netdev"] == "eno1"  # no gid_attrs: the device's only netdev
    assert info(samples, "i40iw0")["link_layer"] == "Ethernet"


def test_doctor_names_what_the_hardware_does_not_provide() -> None:
    assert InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions())).check() == (
        "not provided by the hardware or driver (skipped): i40iw0 port 1: 21 counters"
    )


def test_roce_port_resolves_its_netdev_and_reports_congestion() -> None:
    samples = collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions(hw_stats=("*",)))))
    assert info(samples, "mlx5_2") == {
        "device": "mlx5_2",
        "port": "1",
        "link_layer": "Ethernet",
        "netdev": "ens1f0np0",
        "node_guid": "0c42:a103:0065:7e10",
        "firmware_version": "22.36.1010",
        "board_id": "MT_0000000359",
        "hca_type": "MT4125",
        "rate": "100 Gb/sec (4X EDR)",
    }
    values = port_values(samples, "mlx5_2")
    assert values["lockstep_ib_port_transmitted_bytes_total"] == 2500000000 * 4  # RDMA traffic, ×4 on RoCE too
    assert values["lockstep_ib_port_received_bytes_total"] == 2250000000 * 4
    assert values["lockstep_roce_ecn_marked_packets_total"] == 88231
    assert values["lockstep_roce_cnp_sent_total"] == 88102
    assert values["lockstep_roce_cnp_handled_total"] == 120774
    assert values["lockstep_roce_cnp_ignored_total"] == 0
    assert values["lockstep_roce_icrc_errors_total"] == 0
    assert values["lockstep_rdma_hw_stats_total[roce_adp_retrans]"] == 5
    assert values["lockstep_rdma_hw_stats_total[roce_adp_retrans_to]"] == 1
    assert values["lockstep_rdma_hw_stats_total[rx_write_requests]"] == 777


def test_omnipath_device_without_hca_type_and_with_its_own_hw_counters() -> None:
    samples = collect(InfinibandCollector(context(sys_=SYSFS, options=InfinibandOptions(hw_stats=("*",)))))
    assert info(samples, "hfi1_0")["hca_type"] == ""
    assert info(samples, "hfi1_0")["board_id"] == "Intel Omni-Path Host Fabric Interface Adapter 100 Series"
    values = port_values(samples, "hfi1_0")
    assert values["lockstep_ib_port_transmitted_bytes_total"] == 5702000000 * 4
    assert values["lockstep_ib_port_transmit_wait_total"] == 1213
    assert {k: v for k, v in values.items() if k.startswith("lockstep_rdma_")} == {
        "lockstep_rdma_hw_stats_total[TxPkt]": 180923312,
        "lockstep_rdma_hw_stats_total[TxWords]": 22807887103,
        "lockstep_rdma_hw_stats_total[TxWait]": 1213,
        "lockstep_rdma_hw_stats_total[RxPkt]": 150232844,
        "lockstep_rdma_hw_stats_total[RxWords]": 18380387054,
    }


def test_unparseable_values_are_skipped_counted_and_logged_once(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters" / "symbol_error").write_text("garbage\n")
    (port / "hw_counters" / "out_of_sequence").write_text("12x\n")
    (port / "state").write_text("ACTIVE\n")
    collector = InfinibandCollector(context(sys_=tree, options=InfinibandOptions()))
    with caplog.at_level(logging.WARNING, logger="test"):
        values = port_values(collect(collector), "mlx5_0")
        assert values["lockstep_ib_port_unparseable_values_total"] == 3
        assert "lockstep_ib_port_symbol_errors_total" not in values
        assert "lockstep_rdma_out_of_sequence_total" not in values
        assert "lockstep_ib_port_state" not in values
        # The rest of the port still reports.
        assert values["lockstep_ib_port_transmit_wait_total"] == 28441
        assert values["lockstep_rdma_packet_sequence_errors_total"] == 2
        assert port_values(collect(collector), "mlx5_0")["lockstep_ib_port_unparseable_values_total"] == 6
    warned = sorted(r.counter for r in caplog.records if r.msg == "skipping a value that is not a number")  # type: ignore[attr-defined]
    assert warned == ["out_of_sequence", "state", "symbol_error"]  # once each, not every round


def test_missing_counter_file_is_skipped_alone(tree: Path) -> None:
    counters = tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "port_rcv_errors").unlink()
    (counters / "port_rcv_errors").symlink_to(counters / "no-such-file")  # listed, but ENOENT on open
    values = port_values(collect(InfinibandCollector(context(sys_=tree, options=InfinibandOptions()))), "mlx5_0")
    assert "lockstep_ib_port_receive_errors_total" not in values
    assert values["lockstep_ib_port_unparseable_values_total"] == 0
    assert values["lockstep_ib_port_symbol_errors_total"] == 0


@pytest.mark.real
def test_kernel_errnos_skip_one_counter() -> None:
    """Real files that fail the way an RDMA driver's counter files do: EINVAL (the loopback device's
    speed), EACCES (a 0400 file read by an unprivileged user) and, where this machine has one,
    EOPNOTSUPP (the phys_port_name of a NIC whose driver has none, e.g. virtio_net)."""
    require_real("root and setpriv", os.geteuid() == 0 and shutil.which("setpriv") is not None)
    not_supported = next(
        (p for p in sorted(Path("/sys/class/net").glob("*/phys_port_name")) if _fails_with_eopnotsupp(p)), None
    )
    # Not under pytest's tmp_path: that is private to root, and the reader here is 'nobody'.
    top = Path(tempfile.mkdtemp(prefix="lockstep-ib-errno-"))
    top.chmod(0o755)
    tree = top / "sys"
    shutil.copytree(SYSFS, tree, symlinks=True)
    try:
        counters = tree / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
        (counters / "port_rcv_errors").unlink()
        (counters / "port_rcv_errors").symlink_to("/sys/class/net/lo/speed")
        if not_supported is not None:
            (counters / "port_xmit_discards").unlink()
            (counters / "port_xmit_discards").symlink_to(not_supported)
        (counters / "symbol_error").chmod(0o400)
        script = (
            "import json, sys; from pathlib import Path; from tests.support import context; "
            "from lockstep.collectors.infiniband import InfinibandCollector, InfinibandOptions; "
            "c = InfinibandCollector(context(sys_=Path(sys.argv[1]), options=InfinibandOptions())); "
            "print(json.dumps({s.name: s.value for f in c.collect() for s in f.samples "
            "if s.labels.get('device') == 'mlx5_0' and 'counter' not in s.labels}))"
        )
        result = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", script, str(tree)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        values = json.loads(result.stdout)
    finally:
        shutil.rmtree(top)
    assert "lockstep_ib_port_receive_errors_total" not in values  # EINVAL
    if not_supported is not None:
        assert "lockstep_ib_port_transmit_discards_total" not in values  # EOPNOTSUPP
    assert "lockstep_ib_port_symbol_errors_total" not in values  # EACCES
    assert values["lockstep_ib_port_unparseable_values_total"] == 0  # none of those is an error
    assert values["lockstep_ib_port_transmit_wait_total"] == 28441


def _fails_with_eopnotsupp(path: Path) -> bool:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno == errno.EOPNOTSUPP
    return False


def test_nothing_here_without_class_infiniband(tmp_path: Path) -> None:
    with pytest.raises(NothingHere, match=r"no .*/class/infiniband: no InfiniBand or RDMA devices on this machine"):
        collect(InfinibandCollector(context(sys_=tmp_path, options=InfinibandOptions())))
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    with pytest.raises(NothingHere, match="is empty: no InfiniBand or RDMA devices"):
        collect(InfinibandCollector(context(sys_=tmp_path, options=InfinibandOptions())))


def test_devices_that_come_and_go_are_rediscovered(tree: Path) -> None:
    collector = InfinibandCollector(context(sys_=tree, options=InfinibandOptions()))
    assert info(collect(collector), "hfi1_0")
    shutil.rmtree(tree / "class" / "infiniband" / "hfi1_0")
    samples = collect(collector)
    assert not any(dict(labels).get("device") == "hfi1_0" for _, labels in samples)
    shutil.copytree(SYSFS / "class" / "infiniband" / "hfi1_0", tree / "class" / "infiniband" / "hfi1_0")
    assert info(collect(collector), "hfi1_0")["firmware_version"] == "1.27.0"


def test_hotplug_event_drops_cached_discovery(tree: Path) -> None:
    """A device replaced under the same name (firmware update, driver reload) is only seen anew
    after a hotplug event: discovery is cached while the device list stays the same."""
    collector = InfinibandCollector(context(sys_=tree, options=InfinibandOptions()))
    assert info(collect(collector), "mlx5_0")["firmware_version"] == "20.31.1014"
    (tree / "class" / "infiniband" / "mlx5_0" / "fw_ver").write_text("20.35.1012\n")
    assert info(collect(collector), "mlx5_0")["firmware_version"] == "20.31.1014"
    collector.on_hotplug("change", "infiniband", "/sys/devices/pci0000:00/0000:00:02.0/infiniband/mlx5_0")
    assert info(collect(collector), "mlx5_0")["firmware_version"] == "20.35.1012"


def test_rdma_netdevs_of_the_fixture() -> None:
    assert rdma_netdevs(SYSFS) == {"eno1", "ens1f0np0"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100 Gb/sec (4X EDR)", 12.5e9),
        ("400 Gb/sec (4X NDR)", 50e9),
        ("2.5 Gb/sec (1X SDR)", 312.5e6),
        ("10 Gb/sec (4X)", 1.25e9),
    ],
)
def test_parse_rate(text: str, expected: float) -> None:
    assert parse_rate(text) == expected


def test_parse_state() -> None:
    assert parse_state("4: ACTIVE") == 4
    assert parse_state("5: LinkUp\n") == 5
    with pytest.raises(ValueError, match="expected '<number>: <NAME>'"):
        parse_state("ACTIVE")


@pytest.mark.real
def test_real_uevent_makes_the_agent_rediscover(tree: Path, tmp_path: Path) -> None:
    """A real kernel uevent (a veth pair made by the test, subsystem net) wakes the collector, whose
    interval is an hour, and drops its cached discovery: a device replaced under the same name
    (new firmware) and a removed device both show in the next snapshot."""
    require_real("root and iproute2 (to create a veth pair)", os.geteuid() == 0 and shutil.which("ip") is not None)
    config = tmp_path / "lockstep.yml"
    config.write_text(f"paths:\n  sysfs: {tree}\ncollectors:\n  infiniband:\n    interval: 1h\n")
    available = {"infiniband": InfinibandCollector}
    setup = Setup(config, available, Overrides(disable_defaults=True, enable=frozenset({"infiniband"})), Seams())
    agent = Agent(setup, load_config(config, available, setup.overrides), WebConfig())
    name = "lsi" + uuid.uuid4().hex[:8]

    def firmware() -> dict[str, str]:
        body, _ = agent.exporter.render()
        return {
            dict(labels)["device"]: dict(labels)["firmware_version"]
            for (metric, labels) in samples(body.decode())
            if metric == "lockstep_ib_port_info"
        }

    try:
        assert agent.hotplug is not None and agent.hotplug.subsystems == {"infiniband", "net"}
        wait_until(lambda: len(firmware()) == 5, what="the first run")
        devices = tree / "class" / "infiniband"
        (devices / "mlx5_0" / "fw_ver").write_text("20.35.1012\n")
        shutil.rmtree(devices / "hfi1_0")
        subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
        wait_until(
            lambda: (
                firmware() == {"i40iw0": "0.2", "mlx4_0": "2.42.5000", "mlx5_0": "20.35.1012", "mlx5_2": "22.36.1010"}
            ),
            what="the snapshot after the uevent",
        )
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        agent.stop()


# --- InfiniBand sysfs: the first reproduction, and the smaller defects ---


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    shutil.copytree(SYSFS, tmp_path / "sys", symlinks=True)
    return tmp_path / "sys"


@pytest.mark.real
def test_a_400_digit_ib_counter_is_skipped_and_the_scrape_holds_everything_else(sysfs: Path) -> None:
    (sysfs / MLX5_COUNTERS / "port_xmit_data").write_text("9" * 400)
    (sysfs / MLX5_COUNTERS / "port_rcv_data").write_text(str(1 << 64))  # one past the 64-bit width
    args = ["run", "--collector.disable-defaults", "--collector.infiniband", "--collector.host"]
    with AgentProcess(*args, "--path.sysfs", str(sysfs), "--path.procfs", str(PROC)) as agent:
        text = wait_until(lambda: next((t for t in [agent.metrics()] if "lockstep_ib_port_state" in t), None))
        returncode, stderr = agent.stop()
    s = samples(text)
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    assert collector_up(text, "infiniband") == 1 and collector_up(text, "host") == 1
    assert ("lockstep_ib_port_transmitted_bytes_total", port) not in s
    assert ("lockstep_ib_port_received_bytes_total", port) not in s
    assert s[("lockstep_ib_port_transmit_wait_total", port)] == 28441
    assert s[("lockstep_ib_port_unparseable_values_total", port)] == 2
    assert ("lockstep_host_processes_blocked", frozenset()) in s
    assert returncode == 0
    reasons = [json.loads(line).get("reason", "") for line in stderr.splitlines()]
    assert "99999999999999999999" + "9999... is wider than a 64-bit counter" in reasons
    assert "18446744073709551616... is wider than a 64-bit counter" in reasons


@pytest.mark.parametrize("rate", ["nan Gb/sec", "inf Gb/sec (4X EDR)", "-100 Gb/sec"])
def test_a_rate_that_is_not_a_finite_number_is_skipped_and_counted(sysfs: Path, rate: str) -> None:
    (sysfs / "class/infiniband/mlx5_0/ports/1/rate").write_text(rate + "\n")
    values = collected(InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions())))
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    assert ("lockstep_ib_port_rate_bytes_per_second", port) not in values
    assert values[("lockstep_ib_port_unparseable_values_total", port)] == 1


def test_a_huge_fw_ver_is_not_made_a_label(sysfs: Path) -> None:
    fw_ver = sysfs / "class/infiniband/mlx5_0/fw_ver"
    fw_ver.unlink()  # a symlink into the shared fixture in the copy
    # 100 MiB long, 1 MiB of it on disk: the rest is a hole (reads as zeros), which the test
    # leaves behind in pytest's temporary directory at no cost.
    fw_ver.write_text("2" * (1024 * 1024))
    os.truncate(fw_ver, 100 * 1024 * 1024)
    values = collected(InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions())))
    infos = [labels for name, labels in values if name == "lockstep_ib_port_info" and ("device", "mlx5_0") in labels]
    assert infos and all(("firmware_version", "") in labels for labels in infos)


def test_a_port_directory_removed_and_restored_comes_back(sysfs: Path) -> None:
    collector = InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions()))
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    assert ("lockstep_ib_port_state", port) in collected(collector)
    ports = sysfs / "class/infiniband/mlx5_0/ports"
    shutil.move(ports / "1", sysfs / "saved-port")
    assert ("lockstep_ib_port_state", port) not in collected(collector)
    assert ("lockstep_ib_port_state", port) not in collected(collector)
    shutil.move(sysfs / "saved-port", ports / "1")
    assert ("lockstep_ib_port_state", port) in collected(collector)


@settings(GENERATED, max_examples=25)
@given(st.binary(max_size=64))
def test_any_ib_counter_file_gives_a_64_bit_count_or_is_counted(sysfs: Path, content: bytes) -> None:
    (sysfs / MLX5_COUNTERS / "symbol_error").write_bytes(content)
    values = collected(InfinibandCollector(context(sys_=sysfs, options=InfinibandOptions())))
    port = frozenset({("device", "mlx5_0"), ("port", "1")})
    symbol_errors = values.get(("lockstep_ib_port_symbol_errors_total", port))
    if symbol_errors is None:
        assert values[("lockstep_ib_port_unparseable_values_total", port)] == 1 or content.strip().startswith(b"N/A")
    else:
        assert 0 <= symbol_errors <= 2**64 - 1
