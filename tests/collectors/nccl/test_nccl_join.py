"""The two NCCL collectors name a communicator alike, so PromQL joins them on (job_id, comm).

NCCL prints one 64-bit hash two ways: RAS whole, ``"0x%lx"`` (NVIDIA/nccl v2.30.7-1,
src/ras/client_support.cc jsonStartCommunicator), the Inspector plugin cut to 14 hex digits,
``snprintf(buf, NCCL_COMM_HASH_LENGTH = 17, "0x%lx", hash)`` (v2.28.3-1
ext-profiler/inspector/inspector.cc inspectorCommGetHashStr and inspector.h; the same in
v2.30.7-1 plugins/profiler/inspector/).  Both collectors export the Inspector's form."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from lockstep.agent.collector import CollectorContext, Paths
from lockstep.agent.seams import Seams
from lockstep.collectors.nccl import InspectorCollector, InspectorOptions, RasCollector, RasOptions
from lockstep.collectors.nccl.ras_client import RAS_CONNECT
from lockstep.collectors.nccl.ras_status import comm_id
from lockstep.simulation.fake_ras import FakeCommunicator, FakeJob, FakeRank, FakeRas
from tests.support import FIXTURES, collected
from tests.support.procfs import LISTENER_INODE, USER, listeners, process, tcp_listen

# The communicator of the Inspector fixture: header.id "0x7f8c496ae9f661" (NVIDIA's README
# example), whose whole hash RAS prints as "0x7f8c496ae9f66142".
WHOLE_HASH = 0x7F8C496AE9F66142


def test_ras_and_inspector_series_of_one_communicator_share_their_comm_label(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    shutil.copytree(FIXTURES / "nccl" / "inspector", rootfs / "dumps")
    paths = Paths(sysfs=tmp_path / "sys", procfs=tmp_path / "proc", rootfs=rootfs)
    process(tmp_path / "proc", 2200, sockets=(LISTENER_INODE,))  # rank 3's process, holding the RAS port
    listeners(tmp_path / "proc", tcp_listen("0100007F", 28028, USER, LISTENER_INODE))
    inspector = InspectorCollector(
        CollectorContext(
            paths,
            InspectorOptions(dumps=("/dumps/nccl-inspector-4242/*.log",), start_at="beginning", node_name="node001"),
            logging.getLogger("test"),
        )
    )
    counts = {"Broadcast": 0, "Reduce": 0, "AllGather": 1, "ReduceScatter": 1, "AllReduce": 3}
    job = FakeJob([FakeCommunicator(WHOLE_HASH, 8, [FakeRank(3, "10.0.0.1", 2200, 3, 3, counts)])])
    ras = RasCollector(
        CollectorContext(
            paths,
            RasOptions(node_addresses=("10.0.0.1",)),
            logging.getLogger("test"),
            Seams(RAS_CONNECT.replaced_by(FakeRas(lambda: job).connect)),
        )
    )
    from_inspector = {dict(k[1])["comm"] for k in collected(inspector) if k[0] == "lockstep_nccl_collectives_total"}
    from_ras = {dict(k[1])["comm"] for k in collected(ras) if k[0] == "lockstep_nccl_ras_collectives_total"}
    assert from_inspector == from_ras == {"0x7f8c496ae9f661"}


def test_comm_id_cuts_as_the_plugins_snprintf_does() -> None:
    assert comm_id(f"0x{WHOLE_HASH:x}") == "0x7f8c496ae9f661"
    # "%lx" prints no leading zeros: a hash under 2**56 fits in 14 digits and is printed whole by both.
    assert comm_id(f"0x{0x00AB12:x}") == "0xab12"
    assert comm_id(f"0x{0x00FFFFFFFFFFFFFF:x}") == "0xffffffffffffff"
