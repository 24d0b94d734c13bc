"""Inference engines running on this node: processes whose command line is an engine's
server, and the TCP port each serves its metrics on (procfs: /proc/PID/cmdline, /proc/PID/fd,
/proc/PID/net/tcp{,6})."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.procs import Process, cmdline, listening_sockets, same_network_namespace
from lockstep.collectors.inference.engines import ENGINE_FORMATS

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


def local_host(host: str) -> bool:
    """Whether a URL's host is this node as seen from itself."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def local_engines(procfs: Path, table: dict[int, Process], notes: list[str]) -> list[LocalEngine]:
    """Engine servers among the processes, with the port their metrics are on; what could not
    be looked at is added to ``notes`` (for doctor)."""
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
    for pid in sorted(kinds):
        kind = kinds[pid]
        if not same_netns[pid]:
            notes.append(f"{kind} pid {pid} is in another network namespace (a container): add it as a target")
            continue
        try:
            sockets = listening_sockets(procfs, pid)
        except PermissionError:
            notes.append(f"{kind} pid {pid}: not allowed to read its sockets (run as root)")
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
        found.setdefault((address, port), LocalEngine(kind, pid, root, address, port))
    return sorted(found.values(), key=lambda e: (e.port, e.host))
