"""One line of an NCCL Inspector dump into an ``InspectorRecord``, or ``BadLine`` saying why not.

The format is NCCL's own (NVIDIA/nccl v2.30.7-1, commit 5067397c,
``plugins/profiler/inspector/inspector_json.cc`` and ``json.cc``; the plugin came in 2.28.3 in
``ext-profiler/inspector`` and moved by 2.29): one compact JSON object per line, one line per
recorded operation per communicator (before 2.30.3: per dump, below), written by the process's
dump thread to ``<dump_dir>/<hostname>-pid<pid>.log``::

    {"header":{"id":"0x7f8c496ae9f661","comm_name":"DP Group 0","rank":2,"n_ranks":8,"nnodes":1},
     "metadata":{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":
     "nccl_profiler_interface","dump_timestamp_us":1748030377748202,"hostname":"n12","pid":1639453},
     "coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,
     "coll_exec_time_us":61974,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":277.210914,
     "coll_busbw_gbs":485.119099}}

- ``comm_name`` is in the header from 2.30.3 on (absent before; "unknown" when the job set none).
- What a file holds depends on the plugin's version, and ``comm_name`` tells which (the format
  version says "v4.0" in all of them):
  - from 2.30.3 (``comm_name`` present), every operation the plugin recorded: each communicator
    keeps its completed collectives and P2P operations in rings (``completedCollRing``,
    ``completedP2pRing``, 1,024 entries by default) and each dump drains them (v2.30.7-1
    ``inspector_json.cc``); a full ring overwrites its oldest entry (``inspector_ring.cc``), so
    more than 1,024 operations of a communicator between two dumps lose the oldest;
  - before 2.30.3 (no ``comm_name``: 2.28.3 to 2.29.7), one sample per communicator per dump:
    each completed collective overwrites ``commInfo->completedCollInfo`` and a dump writes that
    one, the latest, if a collective completed since the last dump (v2.28.3-1
    ``ext-profiler/inspector/inspector.cc`` inspectorCommInfoDump, ``inspector_plugin.cc``
    inspectorPluginStopEvent; the same in v2.29.7-1 ``plugins/profiler/inspector/``).  Its
    ``coll_sn`` is NCCL's own count of the communicator's collectives of that type launched
    before it, from 0 (``eDescr.coll.seqNumber = comm->seqNumber[func]`` before the increment,
    v2.28.3-1 ``src/plugin/profiler.cc``; RAS's collective counts are the same counters), so
    ``coll_sn + 1`` collectives of the type completed up to a sample.
- From 2.30.3 a point-to-point operation (``NCCL_INSPECTOR_ENABLE_P2P=1``, the default) has ``p2p_perf``
  instead: ``p2p`` ("Send"/"Recv"), ``p2p_sn``, ``p2p_peer``, ``p2p_msg_size_bytes``,
  ``p2p_exec_time_us``, ``p2p_timing_source``, ``p2p_algobw_gbs``, ``p2p_busbw_gbs``.  Run for
  real, 2.30.7 writes few of them: it waits for kernel events on channels NCCL does not run the
  Send/Recv on, so most never complete (docs/workloads.md).
- ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` adds ``event_trace_sn`` and ``event_trace_ts`` (per-channel
  kernel events) to the perf object: read past, not needed here.
- Bandwidths are printed with ``%lf``; NaN is written as the string ``"nan"``.
- ``coll_timing_source`` is ``kernel_gpu``, ``kernel_cpu`` or ``collective_cpu``; with the default
  ``NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=1`` (2.30) only ``kernel_gpu`` records are written.
- The file is opened with ``fopen(path, "w")`` by the process's first dump: a later process with
  the same pid on the same host truncates it (the tailer then reads it from the start).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# The format versions this reader understands: the major version of
# metadata.inspector_output_format_version ("v4.0" from NCCL 2.28.3 to 2.30.7).
SUPPORTED_FORMAT_MAJOR = "v4"
# Longest accepted string field used as a label (communicator id, host, operation).
MAX_LABEL_LENGTH = 128
# Longest accepted communicator name: the plugin copies the name the job gave NCCL (NCCL itself
# passes the pointer on unbounded) into ``char commNameStr[NCCL_COMM_NAME_MAX]`` with snprintf,
# NCCL_COMM_NAME_MAX = 256 (NVIDIA/nccl v2.30.7-1, plugins/profiler/inspector/inspector.h and
# inspector.cc inspectorFillCommInfo): at most 255 bytes, so at most 255 characters decoded.
MAX_COMM_NAME_LENGTH = 255
# Larger than any real collective (bytes) or kernel time (microseconds): beyond is garbage.
MAX_MESSAGE_BYTES = 1 << 50
MAX_EXEC_TIME_US = 24 * 3600 * 1_000_000
# coll_sn is a uint64_t printed with %lu.
MAX_SEQUENCE_NUMBER = (1 << 64) - 1


class BadLine(ValueError):
    """Why a line is no record: the reason is a label value of the invalid-lines counter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Reasons a line is skipped (the invalid-lines counter's label values).
INVALID_REASONS = ("not_json", "bad_record", "unsupported_format", "too_long")


@dataclass(frozen=True)
class InspectorRecord:
    comm: str  # header.id, the communicator hash as NCCL prints it ("0x7f8c496ae9f661")
    comm_name: str  # header.comm_name, "unknown" when absent
    rank: int
    n_ranks: int
    nnodes: int
    hostname: str
    pid: int
    p2p: bool  # a Send/Recv (p2p_perf) rather than a collective (coll_perf)
    operation: str  # "AllReduce", "ReduceScatter", ..., or "Send"/"Recv"
    # True for a plugin before 2.30.3 (no comm_name): the record is the communicator's latest
    # collective at a dump, a sample, not one of every collective (see the module's docstring).
    sampled: bool
    # coll_sn (or p2p_sn): the operations of this type the communicator launched before this one.
    sn: int
    message_bytes: int
    exec_seconds: float
    # Bus bandwidth in bytes a second (NCCL's GB/s are 1e9 bytes); None when NCCL wrote "nan".
    bus_bytes_per_second: float | None


def parse_line(data: bytes) -> InspectorRecord:
    try:
        obj = json.loads(data)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise BadLine("not_json") from exc
    if not isinstance(obj, dict):
        raise BadLine("not_json")
    header, metadata = obj.get("header"), obj.get("metadata")
    if not isinstance(header, dict) or not isinstance(metadata, dict):
        raise BadLine("bad_record")
    version = metadata.get("inspector_output_format_version")
    if not isinstance(version, str):
        raise BadLine("bad_record")
    if version.split(".")[0] != SUPPORTED_FORMAT_MAJOR:
        raise BadLine("unsupported_format")
    if isinstance(obj.get("coll_perf"), dict):
        perf, prefix, p2p = obj["coll_perf"], "coll", False
    elif isinstance(obj.get("p2p_perf"), dict):
        perf, prefix, p2p = obj["p2p_perf"], "p2p", True
    else:
        raise BadLine("bad_record")
    rank = _int(header.get("rank"), 0, 1 << 31)
    n_ranks = _int(header.get("n_ranks"), 1, 1 << 31)
    message_bytes = _int(perf.get(f"{prefix}_msg_size_bytes"), 0, MAX_MESSAGE_BYTES)
    exec_us = _int(perf.get(f"{prefix}_exec_time_us"), 0, MAX_EXEC_TIME_US)
    sn = _int(perf.get(f"{prefix}_sn"), 0, MAX_SEQUENCE_NUMBER)
    return InspectorRecord(
        comm=_label(header.get("id")),
        comm_name=_label(header.get("comm_name", "unknown"), MAX_COMM_NAME_LENGTH),
        rank=rank,
        n_ranks=n_ranks,
        nnodes=_int(header.get("nnodes"), 0, 1 << 31),
        hostname=_label(metadata.get("hostname")),
        pid=_int(metadata.get("pid"), 1, 1 << 32),
        p2p=p2p,
        operation=_label(perf.get(prefix)),
        sampled="comm_name" not in header,
        sn=sn,
        message_bytes=message_bytes,
        exec_seconds=exec_us / 1e6,
        bus_bytes_per_second=_bandwidth(perf.get(f"{prefix}_busbw_gbs")),
    )


def _int(value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadLine("bad_record")
    return value


def _label(value: Any, longest: int = MAX_LABEL_LENGTH) -> str:
    if not isinstance(value, str) or not value or len(value) > longest:
        raise BadLine("bad_record")
    return value


def _bandwidth(value: Any) -> float | None:
    if value == "nan":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadLine("bad_record")
    return float(value) * 1e9
