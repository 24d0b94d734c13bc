"""Inference engines running on this node: processes whose command line is an engine's
server, and the TCP port each serves its metrics on (procfs: /proc/PID/cmdline, /proc/PID/fd,
/proc/PID/net/tcp{,6}).

Any user can start a process that looks like an engine (``python3 ... vllm serve --port N``),
so what is found is a candidate, not an engine, until it answers as one; and what is found
costs bounded work whatever the number of look-alikes (docs/security.md, "What the agent
trusts about a process"):

- discovery is linear in the processes: one command-line read per candidate command name, one
  read of each network namespace's TCP tables, each process listed once in
  ``lockstep_inference_process_info`` (``engine_processes``);
- at most MAX_DISCOVERED_TARGETS discovered engines are scraped and reported; a candidate
  becomes one by answering a probe as its engine;
- at most MAX_PROBES_PER_ROUND candidates are probed per round, with a PROBE_TIMEOUT, in turn:
  trusted ones first (the agent's own user or root, then a Slurm job's cgroup), then the one
  probed longest ago; a candidate that stays silent is probed less and less often (backoff);
- an engine that answered is scraped every round before any probe, so look-alikes can delay
  the finding of a new engine by a few rounds but never starve one already found.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.collectors.inference.engines import ENGINE_FORMATS
from lockstep.collectors.toolkit.procs import (
    ListeningSocket,
    Process,
    cmdline,
    listening_sockets,
    same_network_namespace,
    slurm_job_of_cgroup,
)

# Discovered engines scraped and reported at most (configured targets are not counted): a
# node runs one engine per GPU or fewer, and a few routers.
MAX_DISCOVERED_TARGETS = 32
# Candidates probed per round at most, and how long a probe of one that never answered may take.
MAX_PROBES_PER_ROUND = 8
PROBE_TIMEOUT = 1.0
# A silent candidate is probed again after 15 s, then 30, 60, ... at most every 240 s.
PROBE_BACKOFF_FIRST = 15.0
PROBE_BACKOFF_MAX = 240.0

# Processes worth reading the command line of (kernel command names, 15 characters).
_CANDIDATE_COMM = re.compile(r"python|vllm|sglang|triton|text-gen|dynamo|pt_main|uvicorn", re.IGNORECASE)


def engine_of(argv: Sequence[str]) -> str | None:
    """The engine a command line starts, or None.

    Console scripts (``vllm serve``) run as ``/usr/bin/python3 /usr/local/bin/vllm serve ...``;
    modules as ``python -m vllm.entrypoints.openai.api_server``; binaries as themselves.
    """
    if not argv:
        return None
    program = argv[0].rsplit("/", 1)[-1]
    if program.startswith("python"):
        args = list(argv[1:])
        while args and args[0].startswith("-") and args[0] != "-m":  # interpreter options
            args = args[2:] if args[0] in ("-X", "-W") else args[1:]
        if len(args) >= 2 and args[0] == "-m":
            return _MODULES.get(args[1])
        return engine_of(args)  # a script: look at it as the program
    if program == "vllm" and argv[1:2] == ["serve"]:
        return "vllm"
    if program == "api_server.py" and "/vllm/entrypoints/" in argv[0]:
        return "vllm"
    if program == "tritonserver":
        return "triton"
    if program in ("text-generation-launcher", "text-generation-router"):
        return "tgi"
    return None


_MODULES = {
    "vllm.entrypoints.openai.api_server": "vllm",
    "vllm.entrypoints.api_server": "vllm",
    "vllm.entrypoints.cli.main": "vllm",
    "sglang.launch_server": "sglang",
    "dynamo.frontend": "dynamo",
}


def _flag_value(argv: Sequence[str], flags: Sequence[str]) -> int | None:
    """The number given to one of ``flags`` (``--port 8000`` or ``--port=8000``)."""
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg.startswith(flag + "="):
                value = arg[len(flag) + 1 :]
            elif arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            else:
                continue
            if value.isdigit():
                return int(value)
    return None


@dataclass(frozen=True)
class LocalEngine:
    """An engine server found among this node's processes."""

    engine: str
    pid: int  # the process listening on the port
    root: int  # the engine's topmost process (e.g. TGI's launcher above its router)
    host: str  # the address to reach it at from here
    port: int
    trust: int = 2  # Trust, lower first: who runs it (see trust_of)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"


class Trust(enum.IntEnum):
    """Who runs a candidate, in the order candidates are probed: what a user cannot fake."""

    AGENT_USER = 0  # root or the agent's own user (/proc/PID is owned by the process's user)
    SLURM_JOB = 1  # in a Slurm job's cgroup (set by slurmd, unlike SLURM_JOB_ID in its environment)
    OTHER = 2  # any other process: any user on the node can start one


def trust_of(procfs: Path, pid: int) -> Trust:
    try:
        owner = os.stat(procfs / str(pid)).st_uid
    except OSError:
        return Trust.OTHER
    if owner in (0, os.geteuid()):
        return Trust.AGENT_USER
    return Trust.SLURM_JOB if slurm_job_of_cgroup(procfs, pid) else Trust.OTHER


@dataclass(frozen=True)
class Counts:
    """What one round of discovery found, for lockstep_inference_discovered_processes."""

    unreadable: int = 0  # candidates whose sockets the agent may not read
    other_namespace: int = 0  # candidates in another network namespace


def local_host(host: str) -> bool:
    """Whether a URL's host is this node as seen from itself."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def local_engines(
    procfs: Path, table: dict[int, Process], notes: list[str], counts: dict[str, int] | None = None
) -> list[LocalEngine]:
    """Engine servers among the processes, with the port their metrics are on; what could not
    be looked at is added to ``notes`` (for doctor, at most a few lines) and ``counts``."""
    counts = counts if counts is not None else {}
    counts.setdefault("unreadable", 0)
    counts.setdefault("other_namespace", 0)
    kinds: dict[int, str] = {}
    argvs: dict[int, list[str]] = {}
    for pid, process in table.items():
        if _CANDIDATE_COMM.search(process.comm):
            argv = cmdline(procfs, pid)
            kind = engine_of(argv)
            if kind:
                kinds[pid], argvs[pid] = kind, argv
    same_netns = same_network_namespace(procfs, kinds)
    found: dict[tuple[str, int], LocalEngine] = {}
    tables: dict[str, dict[int, ListeningSocket]] = {}  # one read per network namespace
    for pid in sorted(kinds):
        kind = kinds[pid]
        if not same_netns[pid]:
            if counts["other_namespace"] < _NOTES_PER_KIND:
                notes.append(f"{kind} pid {pid} is in another network namespace (a container): add it as a target")
            counts["other_namespace"] += 1
            continue
        try:
            sockets = listening_sockets(procfs, pid, tables)
        except PermissionError:
            if counts["unreadable"] < _NOTES_PER_KIND:
                notes.append(f"{kind} pid {pid}: not allowed to read its sockets (run as root)")
            counts["unreadable"] += 1
            continue
        if not sockets:
            continue  # e.g. TGI's launcher: its router child serves
        engine = ENGINE_FORMATS[kind]
        ports = sorted({s.port for s in sockets})
        hinted = _flag_value(argvs[pid], engine.port_flags)
        port = next((p for p in (hinted, engine.default_port) if p in ports), ports[0])
        address = next(s.address for s in sockets if s.port == port)
        if address in ("0.0.0.0", "::"):
            address = "127.0.0.1"  # "::" is dual-stack on Linux unless bindv6only
        root = pid
        while table.get(root) and kinds.get(table[root].ppid) == kind:
            root = table[root].ppid
        # A forked child sharing the listening socket is the same server: keep the topmost.
        if (address, port) not in found:
            found[(address, port)] = LocalEngine(kind, pid, root, address, port, trust_of(procfs, pid))
    for what in ("other_namespace", "unreadable"):
        if counts[what] > _NOTES_PER_KIND:
            notes.append(f"and {counts[what] - _NOTES_PER_KIND} more such processes ({what.replace('_', ' ')})")
    return sorted(found.values(), key=lambda e: (e.port, e.host))


_NOTES_PER_KIND = 3


def engine_processes(
    table: dict[int, Process], engines: dict[str, LocalEngine], others: Sequence[LocalEngine] = ()
) -> dict[str, list[int]]:
    """Each engine's processes (endpoint -> pids), every process under one engine only;
    ``others`` are candidates not reported (silent, over the cap): their processes are nobody's.

    A process belongs to the engine whose listening process it is or descends from; one
    above them (TGI's launcher above its router) to the first engine, by endpoint, under it.
    N look-alikes forked by one process that looks like an engine itself shared that
    parent as their root and each listed all N+1 processes: N x (N+1) series.  Linear in
    the process table."""
    children: dict[int, list[int]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process.pid)
    # Every listening process is its own engine's before any walk, so no walk goes past one.
    owner: dict[int, str] = {}
    for endpoint, engine in sorted(engines.items()):
        owner.setdefault(engine.pid, endpoint)
    for other in others:
        owner.setdefault(other.pid, "")

    def claim(pids: list[int], endpoint: str) -> None:
        stack = list(pids)
        while stack:
            pid = stack.pop()
            if pid in owner:
                continue  # another engine's, and so is everything below it
            owner[pid] = endpoint
            stack.extend(children.get(pid, ()))

    for endpoint, engine in sorted(engines.items()):
        claim(children.get(engine.pid, []), endpoint)
    for endpoint, engine in sorted(engines.items()):
        claim([engine.root], endpoint)
    found: dict[str, list[int]] = {endpoint: [] for endpoint in engines}
    for pid, endpoint in owner.items():
        if endpoint and pid in table:
            found[endpoint].append(pid)
    return {endpoint: sorted(pids) for endpoint, pids in found.items()}


@dataclass
class _Seen:
    """What is known of one candidate (by its URL) across rounds."""

    known: bool = False  # has answered as its engine: a discovered engine, reported
    answered: bool = False  # answered at its last scrape
    failures: int = 0  # scrapes that failed since it last answered
    last_probe: float = -math.inf  # monotonic time of its last scrape

    def due(self, now: float) -> bool:
        if self.failures == 0:
            return True
        limit = PROBE_BACKOFF_MAX if not self.known else PROBE_BACKOFF_FIRST * 4
        return now - self.last_probe >= min(limit, PROBE_BACKOFF_FIRST * 2 ** (self.failures - 1))


@dataclass
class Plan:
    """Which candidates one round scrapes, and how."""

    scrape: list[LocalEngine] = field(default_factory=list)  # engines that answered last time: full timeout
    probe: list[LocalEngine] = field(default_factory=list)  # the rest that are due, in turn
    resting: list[LocalEngine] = field(default_factory=list)  # engines down and backing off: reported down


class Rotation:
    """Chooses, each round, the discovered candidates to scrape: engines that answer, every
    round; then at most MAX_PROBES_PER_ROUND others, trusted and least recently probed first,
    a silent one less and less often.  Holds one small record per candidate present."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def known(self, engine: LocalEngine) -> bool:
        seen = self._seen.get(engine.url)
        return seen is not None and seen.known

    def plan(self, candidates: Sequence[LocalEngine], now: float) -> Plan:
        present = {c.url for c in candidates}
        self._seen = {url: seen for url, seen in self._seen.items() if url in present}
        seen = {c.url: self._seen.get(c.url) or _Seen() for c in candidates}
        order = sorted(candidates, key=lambda c: (c.trust, c.port, c.host))
        known = [c for c in order if seen[c.url].known]
        engines, plan = known[:MAX_DISCOVERED_TARGETS], Plan()
        room = MAX_DISCOVERED_TARGETS - len(engines)
        unknown = [c for c in order if not seen[c.url].known]
        plan.scrape = [c for c in engines if seen[c.url].answered]
        down = [c for c in engines if not seen[c.url].answered and seen[c.url].due(now)]
        down.sort(key=lambda c: seen[c.url].last_probe)
        fresh = [c for c in unknown if seen[c.url].due(now)] if room else []
        fresh.sort(key=lambda c: (c.trust, seen[c.url].last_probe, c.port, c.host))
        plan.probe = (down + fresh[:room])[:MAX_PROBES_PER_ROUND]
        plan.resting = [c for c in engines if not seen[c.url].answered and c not in plan.probe]
        return plan

    def record(self, engine: LocalEngine, answered: bool, now: float) -> None:
        seen = self._seen.setdefault(engine.url, _Seen())
        seen.last_probe = now
        seen.answered = answered
        seen.known = seen.known or answered
        seen.failures = 0 if answered else seen.failures + 1

    def census(self, candidates: Sequence[LocalEngine]) -> dict[str, int]:
        """Candidates by category (lockstep_inference_discovered_processes): engines within the
        cap, the others still probed, and those beyond the cap."""
        known = sum(1 for c in candidates if self.known(c))
        unknown = len(candidates) - known
        room = known < MAX_DISCOVERED_TARGETS
        return {
            "engine": min(known, MAX_DISCOVERED_TARGETS),
            "probing": unknown if room else 0,
            "over_cap": max(0, known - MAX_DISCOVERED_TARGETS) + (0 if room else unknown),
        }

    def silent(self) -> int:
        """Candidates that have never answered and failed their last probe."""
        return sum(1 for seen in self._seen.values() if not seen.known and seen.failures)
