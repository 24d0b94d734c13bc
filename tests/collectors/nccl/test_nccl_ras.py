"""The NCCL RAS collector against the fake RAS service (simulation/fake_ras.py), which speaks
NCCL 2.30.7's wire protocol and writes its JSON byte for byte (checked against the fixture)."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lockstep.agent.cli import probe
from lockstep.agent.collector import CollectorContext, NothingHere, Paths
from lockstep.agent.seams import MONOTONIC_CLOCK, Seams
from lockstep.collectors.nccl import RasCollector, RasOptions
from lockstep.collectors.nccl.ras import local_addresses
from lockstep.collectors.nccl.ras_client import RAS_CONNECT, RasError, TextOnly, connect_tcp, query_status
from lockstep.collectors.nccl.ras_status import parse_status
from lockstep.simulation.fake_ras import (
    FakeCommunicator,
    FakeJob,
    FakeMissingRank,
    FakeRank,
    FakeRas,
    FakeRasServer,
    render_json,
)
from tests.support import FIXTURES, collected
from tests.support.procfs import LISTENER_INODE, OTHER_USER, USER, listeners, process, tcp_listen

FIXTURE = FIXTURES / "nccl" / "ras" / "status-2.30.7.json"
# The `comm` label: RAS's hash ("0x5f4a2b1c9d8e7f60") cut to the Inspector plugin's 14 hex digits.
COMM = "0x5f4a2b1c9d8e7f"
SMALL = "0xa1b2c3d4e5f607"


def counts(all_reduce: int) -> dict[str, int]:
    return {"Broadcast": 1, "Reduce": 0, "AllGather": 12, "ReduceScatter": 12, "AllReduce": all_reduce}


def fixture_job() -> FakeJob:
    """The job of the fixture file."""
    zero = dict.fromkeys(("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"), 0)
    return FakeJob(
        [
            FakeCommunicator(
                0x5F4A2B1C9D8E7F60,
                4,
                [
                    FakeRank(0, "10.0.0.1", 2200, 0, 0, counts(6650)),
                    FakeRank(1, "10.0.0.1", 2201, 1, 1, counts(6650)),
                    FakeRank(2, "10.0.0.2", 3300, 0, 5, counts(6649)),
                ],
                [FakeMissingRank(3, "10.0.0.2", 3301, 1, 6, unresponsive=True, dead=True)],
            ),
            FakeCommunicator(
                0xA1B2C3D4E5F60718,
                2,
                [
                    FakeRank(0, "10.0.0.1", 2200, 0, 0, dict(zero), init_state=7),
                    FakeRank(1, "10.0.0.1", 2201, 1, 1, dict(zero), async_error=5, abort_flag=True),
                ],
            ),
        ]
    )


def procfs(tmp_path: Path, listener: int = 2200) -> Paths:
    """Job 4242's ranks 0 and 1 (pids 2200 and 2201, user 1000) on this node; 2200 listens on
    127.0.0.1:28028, as the first NCCL process of a node does.  ``listener=3300``: node002's
    (10.0.0.2) view, where rank 2's process 3300 listens."""
    proc = tmp_path / "proc"
    for pid in (2200, 2201, 3300):
        process(proc, pid, sockets=(LISTENER_INODE,) if pid == listener else ())
    listeners(proc, tcp_listen("0100007F", 28028, USER, LISTENER_INODE))
    return Paths(sysfs=tmp_path / "sys", procfs=proc, rootfs=tmp_path)


def make(  # type: ignore[no-untyped-def]
    tmp_path: Path, fake: FakeRas, clock: Callable[[], float] | None = None, listener: int = 2200, **options
) -> RasCollector:
    options.setdefault("node_addresses", ("10.0.0.1",))
    seams = Seams(RAS_CONNECT.replaced_by(fake.connect))
    if clock is not None:
        seams.replace(MONOTONIC_CLOCK.replaced_by(clock))
    return RasCollector(
        CollectorContext(
            procfs(tmp_path, listener),
            RasOptions(**options),
            logging.getLogger("test"),
            seams=seams,
        )
    )


def by(s: dict, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    return {tuple(dict(k[1])[key] for key in keys): v for k, v in s.items() if k[0] == name}


def test_the_fake_writes_the_json_status_byte_for_byte_as_nccl() -> None:
    assert render_json(fixture_job()) == FIXTURE.read_text()


def test_the_leader_exports_the_jobs_communicators_and_the_ranks_behind(tmp_path: Path) -> None:
    fake = FakeRas(fixture_job)
    s = collected(make(tmp_path, fake))
    assert by(s, "lockstep_nccl_ras_leader") == {(): 1}  # 10.0.0.1 hosts rank 0 of the largest communicator
    assert by(s, "lockstep_nccl_communicator_ranks", "job_id", "comm") == {("4242", COMM): 4, ("4242", SMALL): 2}
    assert by(s, "lockstep_nccl_communicator_missing_ranks", "comm") == {(COMM,): 1, (SMALL,): 0}
    assert by(s, "lockstep_nccl_communicator_dead_ranks", "comm") == {(COMM,): 1, (SMALL,): 0}
    assert by(s, "lockstep_nccl_communicator_collectives_total", "comm") == {(COMM,): 6675, (SMALL,): 0}
    assert by(s, "lockstep_nccl_rank_collectives_behind", "comm", "rank", "address", "gpu") == {
        (COMM, "2", "10.0.0.2", "5"): 1
    }
    assert by(s, "lockstep_nccl_missing_rank_info", "comm", "rank", "address", "gpu", "status") == {
        (COMM, "3", "10.0.0.2", "6", "dead"): 1
    }
    assert by(s, "lockstep_nccl_ras_info", "nccl_version") == {("2.30.7",): 1}
    assert by(s, "lockstep_nccl_ras_collection_seconds") == {(): 0.012}
    assert by(s, "lockstep_nccl_ras_address_info", "address") == {("10.0.0.1",): 1}
    # Exactly NCCL's documented client commands, nothing else.
    assert fake.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 4", "SET FORMAT json", "STATUS"]


def test_own_ranks_get_their_counts_and_status(tmp_path: Path) -> None:
    s = collected(make(tmp_path, FakeRas(fixture_job)))
    own = by(s, "lockstep_nccl_ras_collectives_total", "comm", "rank", "collective")
    assert own[(COMM, "0", "AllReduce")] == 6650
    assert own[(COMM, "1", "AllGather")] == 12
    assert (COMM, "2", "AllReduce") not in own  # 10.0.0.2 is another node
    assert by(s, "lockstep_nccl_ras_rank_info", "job_id", "comm", "rank", "gpu", "status") == {
        ("4242", COMM, "0", "0", "running"): 1,
        ("4242", COMM, "1", "1", "running"): 1,
        ("4242", SMALL, "0", "0", "initializing"): 1,
        ("4242", SMALL, "1", "1", "aborted"): 1,
    }


def test_a_follower_exports_its_own_ranks_and_queries_only_every_recheck(tmp_path: Path) -> None:
    fake = FakeRas(fixture_job)
    now = [0.0]
    collector = make(tmp_path, fake, node_addresses=("10.0.0.2",), recheck=900.0, clock=lambda: now[0], listener=3300)
    s = collected(collector)
    assert by(s, "lockstep_nccl_ras_leader") == {(): 0}
    assert by(s, "lockstep_nccl_communicator_ranks", "comm") == {}  # the leader's to export
    assert by(s, "lockstep_nccl_ras_collectives_total", "rank", "collective")[("2", "AllReduce")] == 6649
    assert by(s, "lockstep_nccl_ras_address_info", "address") == {("10.0.0.2",): 1}
    now[0] = 899.0
    s = collected(collector)
    assert fake.commands.count("STATUS") == 1
    assert by(s, "lockstep_nccl_ras_collectives_total", "rank", "collective") == {}  # no stale counts
    assert by(s, "lockstep_nccl_ras_address_info", "address") == {("10.0.0.2",): 1}
    now[0] = 900.0
    collected(collector)
    assert fake.commands.count("STATUS") == 2


def test_every_node_role_queries_every_round(tmp_path: Path) -> None:
    fake = FakeRas(fixture_job)
    collector = make(tmp_path, fake, node_addresses=("10.0.0.2",), role="every-node", listener=3300)
    collected(collector)
    s = collected(collector)
    assert fake.commands.count("STATUS") == 2
    assert by(s, "lockstep_nccl_communicator_ranks", "comm") == {(COMM,): 4, (SMALL,): 2}


def test_leadership_passes_when_rank_0_is_missing(tmp_path: Path) -> None:
    job = fixture_job()
    rank0 = job.communicators[0].ranks.pop(0)
    job.communicators[0].missing.append(FakeMissingRank(0, rank0.host, rank0.pid, 0, 0, dead=True))
    s = collected(make(tmp_path, FakeRas(lambda: job)))
    assert by(s, "lockstep_nccl_ras_leader") == {(): 1}  # rank 1, on 10.0.0.1, is the lowest answering


def test_a_slow_answer_fails_the_query_within_the_timeout(tmp_path: Path) -> None:
    collector = make(tmp_path, FakeRas(fixture_job, answer_delay=3.0), timeout=1.0)
    began = time.monotonic()
    s = collected(collector)
    assert time.monotonic() - began < 2.0
    assert by(s, "lockstep_nccl_ras_queries_total", "result") == {
        ("ok",): 0,
        ("failed",): 1,
        ("text_only",): 0,
        ("untrusted",): 0,
    }
    assert by(s, "lockstep_nccl_communicator_ranks", "comm") == {}


def test_an_nccl_without_json_is_reported_text_only(tmp_path: Path) -> None:
    fake = FakeRas(fixture_job, json_supported=False)
    collector = make(tmp_path, fake)
    s = collected(collector)
    assert by(s, "lockstep_nccl_ras_queries_total", "result") == {
        ("ok",): 0,
        ("failed",): 0,
        ("text_only",): 1,
        ("untrusted",): 0,
    }
    with pytest.raises(TextOnly, match="2.28.7"):
        collector.check()
    assert "STATUS" not in fake.commands


def test_nothing_listening_is_nothing_here(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused
        collector = RasCollector(
            CollectorContext(procfs(tmp_path), RasOptions(address=("127.0.0.1", port)), logging.getLogger("t"))
        )
        with pytest.raises(NothingHere, match=f"no NCCL RAS service at 127.0.0.1:{port}"):
            list(collector.collect())


def test_the_client_over_tcp_and_the_fakes_protocol_answers() -> None:
    fake = FakeRas(fixture_job)
    with FakeRasServer(fake) as server:
        document = query_status(connect_tcp, "127.0.0.1", server.port, timeout=5.0, max_bytes=1 << 20)
        assert document == json.loads(FIXTURE.read_text())
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(b"client protocol 2\r\nTIMEOUT x\nSET FORMAT yaml\nHELLO\nMONITOR\n")
            time.sleep(0.2)
            replies = raw.recv(4096).decode()
    assert replies == (
        "SERVER PROTOCOL 2\nERROR: Invalid timeout value x\nERROR: Invalid format yaml\n"
        "ERROR: Unknown command HELLO\nOK\n"
    )


def test_an_oversized_answer_fails_the_query() -> None:
    fake = FakeRas(fixture_job)
    with pytest.raises(RasError, match="exceeds 1000 bytes"):
        query_status(fake.connect, "localhost", 28028, timeout=5.0, max_bytes=1000)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"collective_counts"', '"collectiveCounts"'),
        ('"AllReduce"', '"All_Reduce"'),
        ('"missing_ranks"', '"missing"'),
        ('"considered_dead"', '"dead"'),
        ('"nvml_dev"', '"nvml_device"'),
        ('"init_state"', '"initState"'),
        ('"collection_time_sec"', '"collection_time"'),
    ],
)
def test_a_renamed_field_fails_the_parse_naming_it(old: str, new: str) -> None:
    text = FIXTURE.read_text().replace(old, new)
    with pytest.raises(RasError) as raised:
        parse_status(json.loads(text))
    assert old.strip('"') in str(raised.value)


def test_the_nodes_addresses_are_read_as_nccl_writes_them() -> None:
    """/proc/net/fib_trie and if_inet6 captured from a Linux 6.x host (192.0.2.0/24 renamed 10.0.0.0/24)."""
    assert local_addresses(FIXTURE.parent.parent / "proc") == {
        "127.0.0.1",
        "10.0.0.2",
        "fe80::fc:ff:fe00:1",
        "fd00::2",
        "::1",
    }


def test_doctor_says_an_nccl_without_json_cannot_run_and_why(tmp_path: Path) -> None:
    fake = FakeRas(fixture_job, json_supported=False)
    context = CollectorContext(
        procfs(tmp_path), RasOptions(), logging.getLogger("test"), seams=Seams(RAS_CONNECT.replaced_by(fake.connect))
    )
    status, detail = probe(RasCollector, context)
    assert status == "cannot run"
    assert "this NCCL's RAS speaks text only (JSON status needs NCCL 2.28.7 or later)" in detail


# --- hostile answers (issue 46) ---

ATTACKER = 4000  # a user's process, not NCCL, listening on the RAS port


def results(s: dict) -> dict[str, float]:
    return {key[0]: v for key, v in by(s, "lockstep_nccl_ras_queries_total", "result").items()}


def job_ids(s: dict) -> set[str]:
    return {dict(labels)["job_id"] for (_, labels) in s if "job_id" in dict(labels)}


def test_this_nodes_ranks_are_capped_and_the_rest_counted(tmp_path: Path) -> None:
    """Issue 46 item 11: an answer of 60,000 ranks on this node gave 360,074 series (42 MB page,
    466 MB); scaled down to 3,000 ranks against the default cap of 1,024."""
    many = [FakeRank(r, "10.0.0.1", 2200, r % 8, r % 8, counts(6650)) for r in range(3000)]
    fake = FakeRas(lambda: FakeJob([FakeCommunicator(0x5F4A2B1C9D8E7F60, 3000, many)]))
    collector = make(tmp_path, fake)
    s = collected(collector)
    info = by(s, "lockstep_nccl_ras_rank_info", "rank")
    assert len(info) == 1024
    assert set(info) == {(str(r),) for r in range(1024)}  # the lowest ranks, the same ones every round
    assert len(by(s, "lockstep_nccl_ras_collectives_total", "rank", "collective")) == 1024 * 5
    assert by(s, "lockstep_nccl_ras_skipped_ranks_total") == {(): 3000 - 1024}
    assert len(s) < 6500
    s = collected(collector)
    assert by(s, "lockstep_nccl_ras_skipped_ranks_total") == {(): 2 * (3000 - 1024)}
    assert by(s, "lockstep_nccl_communicator_ranks", "comm") == {(COMM,): 3000}  # the job's view is whole


def test_the_node_rank_cap_is_an_option(tmp_path: Path) -> None:
    s = collected(make(tmp_path, FakeRas(fixture_job), max_node_ranks=3))
    # (comm, rank) in order: COMM's ranks 0 and 1, then SMALL's rank 0.
    assert set(by(s, "lockstep_nccl_ras_rank_info", "comm", "rank")) == {(COMM, "0"), (COMM, "1"), (SMALL, "0")}
    assert by(s, "lockstep_nccl_ras_skipped_ranks_total") == {(): 1}
    s = collected(make(tmp_path / "all", FakeRas(fixture_job)))
    assert by(s, "lockstep_nccl_ras_skipped_ranks_total") == {(): 0}


def test_a_listener_naming_another_users_processes_is_refused(tmp_path: Path) -> None:
    """Issue 46 item 12: a user listens on the RAS port while no NCCL process holds it and
    answers with ranks naming job 4242's processes (another user's) and a dead rank: those
    processes' SLURM_JOB_ID labelled every series, the input of the hang alert for a healthy job."""
    collector = make(tmp_path, FakeRas(fixture_job), listener=0)  # no NCCL process holds the port
    proc = collector.paths.procfs
    process(proc, ATTACKER, uid=OTHER_USER, job=None, sockets=(LISTENER_INODE,))
    listeners(proc, tcp_listen("0100007F", 28028, OTHER_USER, LISTENER_INODE))
    s = collected(collector)
    assert results(s) == {"ok": 0, "failed": 0, "text_only": 0, "untrusted": 1}
    assert job_ids(s) == set()  # no series of job 4242, nor of any job
    assert by(s, "lockstep_nccl_communicator_dead_ranks", "comm") == {}
    assert by(s, "lockstep_nccl_ras_leader") == {(): 0}
    with pytest.raises(RasError, match="pid 4000, which listens on port 28028, is none of the processes"):
        collector.check()


def test_a_listener_naming_its_own_process_gives_its_own_job_only(tmp_path: Path) -> None:
    """The listener names itself (its own job, 777) among ranks naming job 4242's processes:
    the series carry the listener's job, never 4242."""
    job = fixture_job()
    job.communicators[0].ranks[1].pid = ATTACKER
    collector = make(tmp_path, FakeRas(lambda: job), listener=0)
    proc = collector.paths.procfs
    process(proc, ATTACKER, uid=OTHER_USER, job="777", sockets=(LISTENER_INODE,))
    listeners(proc, tcp_listen("0100007F", 28028, OTHER_USER, LISTENER_INODE))
    s = collected(collector)
    assert results(s)["ok"] == 1
    assert job_ids(s) == {"777"}


def test_a_listener_that_does_not_run_as_its_sockets_user_is_refused(tmp_path: Path) -> None:
    """The named process holds the socket, but the socket is another user's (passed to it)."""
    collector = make(tmp_path, FakeRas(fixture_job))
    listeners(collector.paths.procfs, tcp_listen("0100007F", 28028, OTHER_USER, LISTENER_INODE))
    s = collected(collector)
    assert results(s)["untrusted"] == 1
    assert job_ids(s) == set()


def test_a_second_listener_on_the_port_must_be_trusted_too(tmp_path: Path) -> None:
    """NCCL holds 127.0.0.1:28028; a user holds [::1]:28028, which "localhost" may reach first."""
    collector = make(tmp_path, FakeRas(fixture_job))
    proc = collector.paths.procfs
    process(proc, ATTACKER, uid=OTHER_USER, job=None, sockets=(LISTENER_INODE + 1,))
    listeners(
        proc,
        tcp_listen("0100007F", 28028, USER, LISTENER_INODE),
        v6=(tcp_listen("00000000000000000000000001000000", 28028, OTHER_USER, LISTENER_INODE + 1),),
    )
    s = collected(collector)
    assert results(s)["untrusted"] == 1
    assert job_ids(s) == set()


def test_a_listener_that_changes_during_the_query_is_refused(tmp_path: Path) -> None:
    """The socket that answered went away and another took the port before the check."""
    proc = tmp_path / "proc"

    def answer() -> str:
        listeners(proc, tcp_listen("0100007F", 28028, USER, LISTENER_INODE + 7))
        (proc / "2200" / "fd" / "8").symlink_to(f"socket:[{LISTENER_INODE + 7}]")
        return render_json(fixture_job())

    s = collected(make(tmp_path, FakeRas(fixture_job, answer=answer)))
    assert results(s)["untrusted"] == 1


def test_nothing_listening_that_the_agent_can_see_is_refused(tmp_path: Path) -> None:
    collector = make(tmp_path, FakeRas(fixture_job))
    listeners(collector.paths.procfs)  # the connection was answered, but no socket listens here
    s = collected(collector)
    assert results(s)["untrusted"] == 1


def test_a_rank_in_a_container_is_named_by_its_pid_there(tmp_path: Path) -> None:
    """A pod without hostPID: RAS names rank 0's process 17 (its pid in the pod), the host
    knows it as 93445 (NSpid), which holds the port."""
    job = fixture_job()
    for rank in job.communicators[0].ranks[:2] + job.communicators[1].ranks:
        rank.pid = 17 + rank.rank
    collector = make(tmp_path, FakeRas(lambda: job), listener=0)
    process(collector.paths.procfs, 93445, job="5151", sockets=(LISTENER_INODE,), nspid=(93445, 17))
    s = collected(collector)
    assert results(s)["ok"] == 1
    assert job_ids(s) == {"5151"}


def test_a_forked_worker_of_the_job_holding_the_port_is_trusted(tmp_path: Path) -> None:
    """A DataLoader worker forked by a rank holds the rank's listening socket too; found
    before the rank (a lower pid), it is trusted as a process of the named ranks' job and user."""
    collector = make(tmp_path, FakeRas(fixture_job), listener=0)
    process(collector.paths.procfs, 2100, sockets=(LISTENER_INODE,))
    s = collected(collector)
    assert results(s)["ok"] == 1
    assert job_ids(s) == {"4242"}


def test_a_status_nested_100000_levels_deep_is_a_failed_query(tmp_path: Path) -> None:
    """Issue 46 item 13: it raised RecursionError out of the collector, counted nowhere."""
    deep = '{"communicators": ' + "[" * 100_000 + "]" * 100_000 + "}"
    collector = make(tmp_path, FakeRas(fixture_job, answer=lambda: deep))
    s = collected(collector)
    assert results(s) == {"ok": 0, "failed": 1, "text_only": 0, "untrusted": 0}
    with pytest.raises(RasError, match="nested too deep"):
        collector.check()


@pytest.mark.parametrize(
    "document",
    [
        {"communicators": [{"hash": "0x1", "size": 1, "ranks": [], "missing_ranks": []}], "ras": []},
        {"communicators": [], "ras": {"collection_time_sec": 0.1, "timeouts_count": 0}, "nccl_version": ["2"]},
        {"communicators": [{"hash": "0x1", "size": 1, "ranks": [[]], "missing_ranks": []}]},
    ],
)
def test_every_parser_failure_is_a_ras_error(document: dict) -> None:
    with pytest.raises(RasError):
        parse_status(document)
