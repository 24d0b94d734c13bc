"""A client of NCCL's RAS service: one status query, bounded in time and size.

The wire protocol is NCCL's (NVIDIA/nccl v2.30.7-1, commit 5067397c: ``src/ras/client_support.cc``
for the server, ``src/ras/client.cc`` for NVIDIA's own client ``ncclras``): plain text over TCP,
one command a line, case-insensitive, every command but the status ones answered with one line.

    CLIENT PROTOCOL 2   -> SERVER PROTOCOL 2   (2 in every release since RAS came, 2.24)
    TIMEOUT <seconds>   -> OK                  (how long the RAS threads wait for each other)
    SET FORMAT json     -> OK                  (2.28.7+; older: "ERROR: Unknown command SET FORMAT json")
    STATUS              -> the report; the server closes the connection when it is sent
    anything else       -> ERROR: Unknown command <it>

A status query is a collective of the job's RAS threads: the answer takes as long as the
slowest leg (up to TIMEOUT per leg) and grows with the job.  Nothing else is ever sent: no
MONITOR (which streams for ever), no VERBOSE STATUS (text only adds outliers; JSON is complete).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from lockstep.agent.seams import Seam

PROTOCOL = 2
DEFAULT_PORT = 28028
# NCCL's default per-leg timeout (RAS_COLLECTIVE_LEG_TIMEOUT_SEC); ncclras waits that plus as
# much again (RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC) for the answer.
SERVER_LEG_TIMEOUT_SECONDS = 5

# (host, port, timeout in seconds) -> a connected stream socket.  The simulated node answers
# through it with its fake RAS service (simulation/fake_ras.py) on one end of a socket pair.
RAS_CONNECT = Seam[Callable[[str, int, float], socket.socket]]("nccl_ras_connect", "connect to NCCL's RAS port")


class RasError(Exception):
    """The query failed; the message says why, in words."""


class NoRasService(RasError):
    """Nothing listens on the RAS port: no NCCL process on this node (or RAS disabled)."""


class TextOnly(RasError):
    """The NCCL version answering speaks no JSON (before 2.28.7)."""


def connect_tcp(host: str, port: int, timeout: float) -> socket.socket:
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError as exc:
        raise NoRasService(f"nothing listens on {host}:{port}") from exc


def query_status(
    connect: Callable[[str, int, float], socket.socket],
    host: str,
    port: int,
    *,
    timeout: float,
    max_bytes: int,
) -> dict[str, Any]:
    """Ask for the JSON status; the parsed document, or RasError saying why not.

    ``timeout`` bounds the whole exchange: the RAS threads are told ``TIMEOUT`` of its whole
    seconds less one (at least 1) per leg, and the answer must be complete by the deadline.
    """
    deadline = time.monotonic() + timeout
    try:
        sock = connect(host, port, timeout)
    except NoRasService:
        raise
    except OSError as exc:
        raise RasError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
    with sock:
        reader = _Reader(sock, deadline, max_bytes)
        reply = reader.command(f"CLIENT PROTOCOL {PROTOCOL}")
        if not reply.upper().startswith("SERVER PROTOCOL "):
            raise RasError(f"{host}:{port} is not NCCL's RAS service (it answered {reply[:80]!r})")
        reply = reader.command(f"TIMEOUT {max(1, int(timeout) - 1)}")
        if reply != "OK":
            raise RasError(f"TIMEOUT refused: {reply[:200]}")
        reply = reader.command("SET FORMAT json")
        if reply.startswith("ERROR: Unknown command"):
            raise TextOnly("this NCCL's RAS speaks text only (JSON status needs NCCL 2.28.7 or later)")
        if reply != "OK":
            raise RasError(f"SET FORMAT json refused: {reply[:200]}")
        reader.send("STATUS")
        body = reader.rest()
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise RasError(f"the status is not JSON ({len(body)} bytes): {exc}") from exc
    except RecursionError as exc:  # arrays or objects nested deeper than the parser goes
        raise RasError(f"the status is nested too deep to parse ({len(body)} bytes)") from exc
    if not isinstance(document, dict):
        raise RasError("the status is not a JSON object")
    return document


class _Reader:
    def __init__(self, sock: socket.socket, deadline: float, max_bytes: int) -> None:
        self.sock = sock
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.buffer = bytearray()  # appended to in place: a 16 MiB answer arrives in 256 chunks

    def send(self, line: str) -> None:
        self._arm()
        try:
            self.sock.sendall(line.encode("ascii") + b"\n")
        except OSError as exc:
            raise RasError(f"sending {line.split()[0]}: {exc.strerror or exc}") from exc

    def command(self, line: str) -> str:
        """Send one command and return its one-line answer (without the newline)."""
        self.send(line)
        while b"\n" not in self.buffer:
            if not self._receive():
                raise RasError(f"the connection closed before the answer to {line.split()[0]}")
        end = self.buffer.index(b"\n")
        answer = bytes(self.buffer[:end])
        del self.buffer[: end + 1]
        return answer.decode("utf-8", "replace").rstrip("\r")

    def rest(self) -> bytearray:
        """Everything until the server closes the connection."""
        while self._receive():
            pass
        return self.buffer

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RasError("no complete answer within the timeout")
        self.sock.settimeout(left)

    def _receive(self) -> bool:
        self._arm()
        try:
            chunk = self.sock.recv(min(1 << 16, self.max_bytes + 1 - len(self.buffer)))
        except TimeoutError as exc:
            raise RasError("no complete answer within the timeout") from exc
        except OSError as exc:
            raise RasError(f"receiving: {exc.strerror or exc}") from exc
        self.buffer += chunk
        if len(self.buffer) > self.max_bytes:
            raise RasError(f"the answer exceeds {self.max_bytes} bytes")
        return bool(chunk)
