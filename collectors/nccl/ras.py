"""The NCCL RAS collector: asks the local NCCL RAS service for the job's communicators.

Every NCCL process (2.24+) runs a RAS thread; the threads of one job form a network, and the
first process on a node to start listens on localhost:28028 for clients.  A status query is
answered by a collective over the whole job: every process contributes its communicators'
ranks, their status and per-type collective counts.  So one query costs the whole job, and a
job of N nodes whose N agents each asked every round would pay N job-wide collectives a round.

Who asks (``role``):
- ``leader`` (the default): the node hosting rank 0 of the job's largest communicator asks
  every round and exports the job's view: per communicator its size, missing and dead ranks,
  how far its furthest rank got, and the ranks behind (named by address, GPU).  Every other
  node asks once every ``recheck`` (15 min) to learn whether it became the leader (a new job),
  and exports its own addresses so the leader's rank series join to it.  Cost: one job-wide
  query per round plus N per ``recheck``.
- ``every-node``: every node asks every round.  Cost: N job-wide queries per round; for small
  jobs, or to see every node's own ranks' counts all the time.
On every query the node's own ranks (those on its addresses) get their counts and status, at
most ``max_node_ranks`` of them (the rest counted).

A node whose port refuses the connection runs no NCCL process: nothing here, quietly.

Hostile answers (issue 46): an answer is trusted only when the socket listening on the port is
held by a process the answer names as this node's rank (ras_listener.py), and the series carry
that process's job; else it is refused and counted (``result="untrusted"``).  Every answer that
cannot be parsed, however (not JSON, nested past the parser's depth, fields of the wrong type),
is a failed query, counted, never a failed collector.
"""

from __future__ import annotations

import functools
import ipaddress
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.collector import Collector, CollectorContext, Families, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.agent.options import (
    option,
    parse_choice,
    parse_duration,
    parse_positive_int,
    parse_string,
    parse_string_list,
)
from lockstep.agent.seams import MONOTONIC_CLOCK
from lockstep.collectors.nccl.ras_client import (
    DEFAULT_PORT,
    RAS_CONNECT,
    NoRasService,
    RasError,
    TextOnly,
    connect_tcp,
    query_status,
)
from lockstep.collectors.nccl.ras_listener import Untrusted, trusted_listener
from lockstep.collectors.nccl.ras_metrics import (
    ADDRESS_INFO,
    COLLECTION_SECONDS,
    COMM_COLLECTIVES,
    COMM_DEAD,
    COMM_MISSING,
    COMM_RANKS,
    INFO,
    LEADER,
    MISSING_RANK,
    OWN_COLLECTIVES,
    OWN_RANK,
    QUERIES,
    RANK_BEHIND,
    SKIPPED_RANKS,
)
from lockstep.collectors.nccl.ras_status import COLLECTIVES, Communicator, Rank, Status, parse_status
from lockstep.collectors.toolkit.procs import listeners_on_port, slurm_job

QUERY_RESULTS = ("ok", "failed", "text_only", "untrusted")


def parse_address(value: object) -> tuple[str, int]:
    """'host:port' or 'host' (port 28028), as NCCL_RAS_ADDR is written."""
    text = parse_string(value)
    host, colon, port = text.rpartition(":")
    if not colon:
        return text, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"expected host:port (e.g. localhost:28028), got {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class RasOptions:
    address: tuple[str, int] = option(
        ("localhost", DEFAULT_PORT),
        parse_address,
        "where NCCL's RAS service listens (NCCL_RAS_ADDR of the jobs), host:port",
        flag="--nccl-ras.address",
    )
    role: str = option(
        "leader",
        parse_choice(("leader", "every-node")),
        "leader: only the node hosting rank 0 of the job's largest communicator queries every round; "
        "every-node: every node queries every round (each query costs the whole job)",
    )
    recheck: float = option(900.0, parse_duration, "how often a node that is not the leader queries, to re-check")
    timeout: float = option(
        5.0,
        functools.partial(parse_duration, minimum=1.0),
        "how long one query may take in all (RAS's per-leg TIMEOUT is one second less)",
    )
    max_reply_bytes: int = option(
        16 * 1024 * 1024,
        functools.partial(parse_positive_int, maximum=1 << 30),
        "largest status answer read; a larger one fails the query",
    )
    max_listed_ranks: int = option(
        64, parse_positive_int, "most ranks behind, and most missing ranks, listed per communicator"
    )
    max_communicators: int = option(256, parse_positive_int, "most communicators exported")
    max_node_ranks: int = option(
        1024,
        parse_positive_int,
        "most of this node's ranks exported (a rank per communicator it is in, 6 series each); "
        "the rest are counted in lockstep_nccl_ras_skipped_ranks_total",
    )
    node_addresses: tuple[str, ...] = option(
        (),
        parse_string_list,
        "this node's addresses as RAS reports its ranks; default: every address of its interfaces",
    )


class RasCollector(Collector[RasOptions]):
    name = "nccl_ras"
    help = "The job's NCCL communicators from NCCL's RAS service: size, missing and dead ranks, ranks behind."
    default_interval = 30.0
    metrics = (
        QUERIES,
        LEADER,
        INFO,
        COLLECTION_SECONDS,
        ADDRESS_INFO,
        COMM_RANKS,
        COMM_MISSING,
        COMM_DEAD,
        COMM_COLLECTIVES,
        RANK_BEHIND,
        MISSING_RANK,
        OWN_COLLECTIVES,
        OWN_RANK,
        SKIPPED_RANKS,
    )
    options_class = RasOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        # When the last query was made, for recheck (the simulated node and tests replace the
        # clock through the seam, agent/seams.py).
        self._clock = context.seams.get(MONOTONIC_CLOCK) or time.monotonic
        self._connect = context.seams.get(RAS_CONNECT) or connect_tcp
        self._queries = dict.fromkeys(QUERY_RESULTS, 0)
        self._leader = False
        self._last_query: float | None = None
        self._own_addresses: set[str] = set()  # this node's addresses seen in the last answer
        self._listener: int | None = None  # the pid trusted last (looked at first next time)
        self._skipped_ranks = 0  # this node's ranks past max_node_ranks, over every answer
        self._last_skipped = 0  # in the last answer (logged when it changes)
        self._problem = ""

    def check(self) -> str:
        status, _ = self._query()
        return (
            f"NCCL {status.nccl_version} RAS at {self._where()}: {len(status.communicators)} communicator(s), "
            f"answered in {status.collection_seconds:.3f} s"
        )

    def collect(self) -> Iterator[Metric]:
        families = Families(self.metrics)
        now = self._clock()
        due = (
            self._leader
            or self.options.role == "every-node"
            or self._last_query is None
            or now - self._last_query >= self.options.recheck
        )
        if due:
            self._last_query = now
            try:
                status, listener = self._query()
            except NothingHere:
                self._leader = False
                self._own_addresses = set()
                raise
            except TextOnly as exc:
                self._queries["text_only"] += 1
                self._log_once(str(exc))
            except Untrusted as exc:
                self._queries["untrusted"] += 1
                self._log_once(f"RAS answer from {self._where()} refused: {exc}")
            except RasError as exc:
                self._queries["failed"] += 1
                self._log_once(f"RAS query to {self._where()} failed: {exc}")
            else:
                self._queries["ok"] += 1
                self._problem = ""
                self._export(status, listener, families)
        for result in QUERY_RESULTS:
            families[QUERIES].add_metric([result], self._queries[result])
        families[SKIPPED_RANKS].add_metric([], self._skipped_ranks)
        families[LEADER].add_metric([], 1 if self._leader else 0)
        for address in sorted(self._own_addresses):
            families[ADDRESS_INFO].add_metric([address], 1)
        return iter(families.with_samples())

    # --- the query ---

    def _where(self) -> str:
        host, port = self.options.address
        return f"{host}:{port}"

    def _query(self) -> tuple[Status, int]:
        """The answer and the pid it is trusted to come from (whose job it is), or NothingHere,
        RasError (failed, text only) or Untrusted (refused)."""
        host, port = self.options.address
        procfs = self.paths.procfs
        before = listeners_on_port(procfs, port)
        try:
            document = query_status(
                self._connect, host, port, timeout=self.options.timeout, max_bytes=self.options.max_reply_bytes
            )
        except NoRasService as exc:
            raise NothingHere(f"no NCCL RAS service at {self._where()} ({exc}): no NCCL job on this node") from exc
        status = parse_status(document)
        local = self._local_addresses()
        named = {rank.pid for _, rank in _node_ranks(status.communicators, local)}
        after = listeners_on_port(procfs, port)
        self._listener = trusted_listener(procfs, port, before, after, named, self._listener)
        return status, self._listener

    def _log_once(self, problem: str) -> None:
        if problem != self._problem:
            self.log.warning(problem)
            self._problem = problem

    def _local_addresses(self) -> set[str]:
        if self.options.node_addresses:
            return set(self.options.node_addresses)
        return local_addresses(self.paths.procfs)

    # --- the answer ---

    def _export(self, status: Status, listener: int, families: Families) -> None:
        local = self._local_addresses()
        communicators = status.communicators[: self.options.max_communicators]
        own = _node_ranks(communicators, local)
        # Loopback is every node's: it joins no rank to a node.
        self._own_addresses = {rank.host for _, rank in own if not _loopback(rank.host)}
        # The job of the process holding the RAS port, which the answer names (ras_listener.py):
        # never that of a pid the answer merely names.
        job_id = slurm_job(self.paths.procfs, listener) or "unknown"
        self._leader = _leads(communicators, local)
        families[INFO].add_metric([status.nccl_version], 1)
        families[COLLECTION_SECONDS].add_metric([], status.collection_seconds)
        kept = sorted(own, key=lambda cr: (cr[0].comm, cr[1].rank))[: self.options.max_node_ranks]
        skipped = len(own) - len(kept)
        self._skipped_ranks += skipped
        if skipped != self._last_skipped and skipped:
            self.log.warning(
                f"{len(own)} ranks of this node in the RAS answer, more than max_node_ranks "
                f"({self.options.max_node_ranks}): {skipped} not exported"
            )
        self._last_skipped = skipped
        for comm, rank in kept:
            labels = [job_id, comm.comm, str(rank.rank)]
            families[OWN_RANK].add_metric([*labels, str(rank.nvml_dev), rank.status], 1)
            for collective in COLLECTIVES:
                families[OWN_COLLECTIVES].add_metric([*labels, collective], rank.counts[collective])
        if not (self._leader or self.options.role == "every-node"):
            return  # the leader exports the job's view; one copy of it is enough
        for comm in sorted(communicators, key=lambda c: c.comm):
            self._export_communicator(job_id, comm, families)

    def _export_communicator(self, job_id: str, comm: Communicator, families: Families) -> None:
        labels = [job_id, comm.comm]
        families[COMM_RANKS].add_metric(labels, comm.size)
        families[COMM_MISSING].add_metric(labels, len(comm.missing))
        families[COMM_DEAD].add_metric(labels, sum(1 for m in comm.missing if m.dead))
        furthest = max((rank.total for rank in comm.ranks), default=0)
        families[COMM_COLLECTIVES].add_metric(labels, furthest)
        behind = sorted((r for r in comm.ranks if r.total < furthest), key=lambda r: (r.total, r.rank))
        for rank in behind[: self.options.max_listed_ranks]:
            families[RANK_BEHIND].add_metric(
                [*labels, str(rank.rank), rank.host, str(rank.nvml_dev)], furthest - rank.total
            )
        for missing in sorted(comm.missing, key=lambda m: m.rank)[: self.options.max_listed_ranks]:
            families[MISSING_RANK].add_metric(
                [*labels, str(missing.rank), missing.host, str(missing.nvml_dev), missing.status], 1
            )


def local_addresses(procfs: Path) -> set[str]:
    """This network namespace's addresses, written as NCCL's inet_ntop writes them: IPv4 from
    the LOCAL host routes of <procfs>/net/fib_trie, IPv6 from <procfs>/net/if_inet6."""
    found: set[str] = set()
    try:
        last = ""
        for line in read_text(procfs / "net" / "fib_trie").splitlines():
            text = line.strip()
            if text.startswith("|-- "):
                last = text[4:]
            elif text == "/32 host LOCAL" and last:
                found.add(last)
    except OSError:
        pass
    try:
        for line in read_text(procfs / "net" / "if_inet6").splitlines():
            fields = line.split()
            if fields and len(fields[0]) == 32:
                try:
                    found.add(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
                except ValueError:
                    continue
    except OSError:
        pass
    return found


def _node_ranks(communicators: tuple[Communicator, ...], local: set[str]) -> list[tuple[Communicator, Rank]]:
    """The ranks on this node's addresses, with their communicator."""
    return [(comm, rank) for comm in communicators for rank in comm.ranks if rank.host in local]


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _leads(communicators: tuple[Communicator, ...], local: set[str]) -> bool:
    """Whether this node hosts the lowest answering rank (rank 0 unless it is missing) of the
    largest communicator (ties: the lowest hash): one node per job, which every node can tell
    from the same answer."""
    if not communicators:
        return False
    largest = min(communicators, key=lambda c: (-c.size, c.hash))
    first = min(largest.ranks, key=lambda r: r.rank, default=None)
    return first is not None and first.host in local
