"""A fake NCCL RAS service: the client side of NCCL's wire protocol, answered from a job
described in Python, for the simulated node and the tests (no NCCL runs here).

Built from NCCL v2.30.7-1 (NVIDIA/nccl commit 5067397c), ``src/ras/client_support.cc``:
- ``rasClientEventLoop``: commands are lines ending in "\\n" (a "\\r" before it is dropped),
  matched case-insensitively: ``CLIENT PROTOCOL <n>`` -> ``SERVER PROTOCOL 2``;
  ``TIMEOUT <n>`` -> ``OK`` or ``ERROR: Invalid timeout value <n>``; ``SET FORMAT text|json``
  -> ``OK`` or ``ERROR: Invalid format <f>``; ``STATUS`` / ``VERBOSE STATUS`` -> the report,
  after which the server closes the connection; ``MONITOR`` -> ``OK`` and events (none here);
  anything else -> ``ERROR: Unknown command <line>``.  Versions before 2.28.7 know no
  ``SET FORMAT`` (``json_supported=False``): it is an unknown command there.
- ``jsonWriteHeader`` ... ``jsonWriteFooter``: the JSON report, reproduced byte for byte
  (two-space indentation, ``%lu`` counts, ``%.3f`` collection time, the five collective
  types of ``NCCL_NUM_FUNCTIONS`` in ncclFunc_t order).
- The text report (``rasClientRunInit``/``rasClientRunComms``) is reproduced only in its
  opening lines: nothing in Lockstep parses it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lockstep.collectors.nccl.ras_client import NoRasService

# ncclFuncToString of ncclFunc_t 0..4 (NCCL_NUM_FUNCTIONS), the order NCCL prints them in.
COLLECTIVES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


@dataclass
class FakeRank:
    rank: int
    host: str  # the IP address of the rank's RAS thread
    pid: int
    cuda_dev: int
    nvml_dev: int
    counts: dict[str, int] = field(default_factory=dict)
    init_state: int = 0
    async_error: int = 0
    finalize_called: bool = False
    destroy_flag: bool = False
    abort_flag: bool = False


@dataclass
class FakeMissingRank:
    rank: int
    host: str
    pid: int
    cuda_dev: int
    nvml_dev: int
    unresponsive: bool = True
    dead: bool = False


@dataclass
class FakeCommunicator:
    comm_hash: int  # written whole, "0x%lx", as RAS does (the Inspector plugin cuts it to 14 hex digits)
    size: int
    ranks: list[FakeRank]
    missing: list[FakeMissingRank] = field(default_factory=list)
    host_hash: int = 0x9A3B5C7D1E2F4A6B
    pid_hash: int = 0x1F2E3D4C5B6A7988


@dataclass
class FakeJob:
    communicators: list[FakeCommunicator]
    nccl_version: str = "2.30.7"
    cuda_runtime_version: int = 12090
    cuda_driver_version: int = 13000
    timestamp: str = "2026-11-25 19:00:00"
    collection_time_sec: float = 0.012
    timeouts_count: int = 0


def render_json(job: FakeJob) -> str:
    """The JSON status exactly as rasDumpCommsToJSON writes it."""
    out = [
        "{\n",
        f'  "nccl_version": "{job.nccl_version}",\n',
        f'  "cuda_runtime_version": {job.cuda_runtime_version},\n',
        f'  "cuda_driver_version": {job.cuda_driver_version},\n',
        f'  "timestamp": "{job.timestamp}",\n',
        f'  "communicators_count": {len(job.communicators)},\n',
        '  "communicators": [\n',
    ]
    for index, comm in enumerate(job.communicators):
        if index:
            out.append(",\n")
        out += [
            "    {\n",
            f'      "hash": "0x{comm.comm_hash:x}",\n',
            f'      "secondary_hash": "0x{comm.host_hash:x}:0x{comm.pid_hash:x}",\n',
            f'      "size": {comm.size},\n',
            f'      "ranks_count": {len(comm.ranks)},\n',
            f'      "missing_ranks_count": {len(comm.missing)},\n',
            '      "ranks": [\n',
        ]
        for r, rank in enumerate(comm.ranks):
            if r:
                out.append(",\n")
            out += [
                "        {\n",
                f'          "rank": {rank.rank},\n',
                f'          "host": "{rank.host}",\n',
                f'          "pid": {rank.pid},\n',
                f'          "cuda_dev": {rank.cuda_dev},\n',
                f'          "nvml_dev": {rank.nvml_dev},\n',
                '          "status": {\n',
                f'            "init_state": {rank.init_state},\n',
                f'            "async_error": {rank.async_error},\n',
                f'            "finalize_called": {_bool(rank.finalize_called)},\n',
                f'            "destroy_flag": {_bool(rank.destroy_flag)},\n',
                f'            "abort_flag": {_bool(rank.abort_flag)}\n',
                "          },\n",
                '          "collective_counts": {\n',
            ]
            for c, name in enumerate(COLLECTIVES):
                out.append(f'            "{name}": {rank.counts.get(name, 0)}')
                out.append("," if c < len(COLLECTIVES) - 1 else "")
                out.append("\n")
            out += ["          }\n", "        }"]
        out += ["\n      ],\n", '      "missing_ranks": [\n']
        for m, missing in enumerate(comm.missing):
            if m:
                out.append(",\n")
            out += [
                "        {\n",
                f'          "rank": {missing.rank},\n',
                f'          "host": "{missing.host}",\n',
                f'          "pid": {missing.pid},\n',
                f'          "cuda_dev": {missing.cuda_dev},\n',
                f'          "nvml_dev": {missing.nvml_dev},\n',
                '          "status": {\n',
                f'            "unresponsive": {_bool(missing.unresponsive)},\n',
                f'            "considered_dead": {_bool(missing.dead)}\n',
                "          }\n",
                "        }",
            ]
        out += ["\n      ]\n", "    }"]
    out += [
        "\n  ],\n",
        '  "ras": {\n',
        f'    "collection_time_sec": {job.collection_time_sec:.3f},\n',
        f'    "timeouts_count": {job.timeouts_count}\n',
        "  }\n",
        "}\n",
    ]
    return "".join(out)


def render_text(job: FakeJob) -> str:
    """The opening of the text report (rasClientRunInit); the rest is not reproduced."""
    return (
        f"NCCL version {job.nccl_version} compiled with CUDA 12.9\n"
        f"CUDA runtime version {job.cuda_runtime_version}, driver version {job.cuda_driver_version}\n\n"
        "Job summary\n===========\n\n"
    )


def _bool(value: bool) -> str:
    return "true" if value else "false"


class FakeRas:
    """Serves NCCL's RAS client protocol on connected sockets, one thread per connection.

    ``job`` is called for each status report (so it can follow a simulated clock); None means
    no NCCL process runs: a connection is refused.
    ``answer_delay`` holds every status report back that long (a large or troubled job);
    ``json_supported=False`` is an NCCL before 2.28.7.  ``answer``, when given, is the status
    report's text instead of the job's (a hostile listener's, for the tests).  ``commands``
    records every line received.
    """

    def __init__(
        self,
        job: Callable[[], FakeJob | None],
        *,
        json_supported: bool = True,
        answer_delay: float = 0.0,
        answer: Callable[[], str] | None = None,
    ) -> None:
        self.job = job
        self.answer = answer
        self.json_supported = json_supported
        self.answer_delay = answer_delay
        self.commands: list[str] = []
        self._lock = threading.Lock()

    def serve(self, sock: socket.socket) -> None:
        """Answer one client until it closes or its status report is sent."""
        json_format = False
        buffer = b""
        with sock:
            while True:
                try:
                    chunk = sock.recv(4096)
                except OSError:
                    return
                if not chunk:
                    return
                buffer += chunk
                while b"\n" in buffer:
                    raw, _, buffer = buffer.partition(b"\n")
                    command = raw.decode("utf-8", "replace").removesuffix("\r")
                    with self._lock:
                        self.commands.append(command)
                    lower = command.lower()
                    if lower.startswith("client protocol "):
                        reply = "SERVER PROTOCOL 2\n"
                    elif lower.startswith("timeout "):
                        value = command[len("timeout ") :]
                        valid = value.isascii() and value.isdigit()
                        reply = "OK\n" if valid else f"ERROR: Invalid timeout value {value}\n"
                    elif lower.startswith("set format ") and self.json_supported:
                        wanted = command[len("set format ") :].lower()
                        if wanted in ("text", "json"):
                            json_format = wanted == "json"
                            reply = "OK\n"
                        else:
                            reply = f"ERROR: Invalid format {command[len('set format ') :]}\n"
                    elif lower in ("status", "verbose status"):
                        if self.answer_delay:
                            time.sleep(self.answer_delay)
                        job = self.job()
                        if job is None:
                            return  # the job ended meanwhile: the connection closes unanswered
                        report = render_json(job) if json_format else render_text(job)
                        if self.answer is not None:
                            report = self.answer()
                        try:
                            sock.sendall(report.encode())
                        except OSError:
                            pass
                        return  # RAS_CLIENT_FINISHED: the server closes once the report is sent
                    elif lower == "monitor" or lower.startswith("monitor "):
                        reply = "OK\n"
                    else:
                        reply = f"ERROR: Unknown command {command}\n"
                    try:
                        sock.sendall(reply.encode())
                    except OSError:
                        return

    def connect(self, host: str, port: int, timeout: float) -> socket.socket:
        """A socket connected to this fake (the collector's RAS_CONNECT seam): one end of a
        socket pair, the other served by a thread that ends with the connection."""
        if self.job() is None:
            raise NoRasService(f"nothing listens on {host}:{port}")
        ours, theirs = socket.socketpair()
        threading.Thread(target=self.serve, args=(theirs,), name="fake-ras", daemon=True).start()
        ours.settimeout(timeout)
        return ours


class FakeRasServer:
    """The fake on a real TCP port of 127.0.0.1, as NCCL listens (for the client's real path)."""

    def __init__(self, fake: FakeRas) -> None:
        self.fake = fake
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)  # accept() returns now and then to see whether to stop
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="fake-ras-server", daemon=True)

    def __enter__(self) -> FakeRasServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            threading.Thread(target=self.fake.serve, args=(conn,), name="fake-ras", daemon=True).start()
