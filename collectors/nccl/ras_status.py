"""NCCL's RAS JSON status into typed communicators and ranks.

The document is NCCL's (v2.30.7-1, ``src/ras/client_support.cc``: jsonWriteHeader,
jsonStartCommunicator, jsonWriteRankData, jsonWriteMissingRank, jsonWriteFooter)::

    {"nccl_version": "2.30.7", "cuda_runtime_version": 12090, "cuda_driver_version": 13000,
     "timestamp": "2026-11-25 19:00:00", "communicators_count": 1,
     "communicators": [{"hash": "0x5f4a...", "secondary_hash": "0x...:0x...", "size": 16,
        "ranks_count": 15, "missing_ranks_count": 1,
        "ranks": [{"rank": 0, "host": "10.0.0.1", "pid": 2200, "cuda_dev": 0, "nvml_dev": 0,
                   "status": {"init_state": 0, "async_error": 0, "finalize_called": false,
                              "destroy_flag": false, "abort_flag": false},
                   "collective_counts": {"Broadcast": 0, "Reduce": 0, "AllGather": 12,
                                         "ReduceScatter": 12, "AllReduce": 6650}}, ...],
        "missing_ranks": [{"rank": 9, "host": "10.0.0.2", "pid": 2301, "cuda_dev": 1, "nvml_dev": 1,
                           "status": {"unresponsive": true, "considered_dead": false}}]}],
     "ras": {"collection_time_sec": 0.012, "timeouts_count": 0}}

``host`` is the IP address of the rank's RAS thread (NCCL's bootstrap interface), ``pid`` -1
and ``host`` "unknown" when RAS has no information on the process.  ``nvml_dev`` is the NVML
index (unique on the node, whatever CUDA_VISIBLE_DEVICES says).  ``init_state`` is an
ncclResult_t: 0 success, 7 (ncclInProgress) initialising, anything else an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lockstep.collectors.nccl.ras_client import RasError

# ncclFuncToString of ncclFunc_t 0..NCCL_NUM_FUNCTIONS-1: the keys of collective_counts.
COLLECTIVES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
INIT_IN_PROGRESS = 7  # ncclInProgress
MAX_LABEL_LENGTH = 128
# How long the Inspector plugin's communicator id is: it prints the same 64-bit hash as RAS
# ("0x%lx", client_support.cc jsonStartCommunicator) into a buffer of NCCL_COMM_HASH_LENGTH = 17
# (snprintf in inspectorCommGetHashStr: NVIDIA/nccl v2.28.3-1 ext-profiler/inspector/inspector.cc
# and inspector.h, unchanged in v2.30.7-1 plugins/profiler/inspector/): "0x" and at most 14 hex
# digits.  So the first 16 characters of RAS's hash are the Inspector's id.
INSPECTOR_ID_LENGTH = 16


def comm_id(hash_text: str) -> str:
    """The communicator as both NCCL collectors name it in their ``comm`` label: RAS's hash cut
    as the Inspector plugin cuts it, so that ``on (job_id, comm)`` joins the two sources with no
    relabelling.  Two communicators of one job alike in their first 56 bits would share it: a
    chance of 1 in 2^56 per pair."""
    return hash_text[:INSPECTOR_ID_LENGTH]


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str
    pid: int
    nvml_dev: int
    init_state: int
    async_error: int
    finalize_called: bool
    destroy_flag: bool
    abort_flag: bool
    counts: dict[str, int]

    @property
    def status(self) -> str:
        """One word for the rank's state, worst first."""
        if self.abort_flag:
            return "aborted"
        if self.init_state not in (0, INIT_IN_PROGRESS):
            return "init_error"
        if self.async_error not in (0, INIT_IN_PROGRESS):
            return "async_error"
        if self.init_state == INIT_IN_PROGRESS:
            return "initializing"
        if self.finalize_called or self.destroy_flag:
            return "finalizing"
        return "running"

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class MissingRank:
    rank: int
    host: str
    pid: int
    nvml_dev: int
    unresponsive: bool
    dead: bool

    @property
    def status(self) -> str:
        return "dead" if self.dead else "unresponsive" if self.unresponsive else "missing"


@dataclass(frozen=True)
class Communicator:
    hash: str  # as RAS prints it, whole: "0x5f4a2b1c9d8e7f60"
    size: int
    ranks: tuple[Rank, ...]
    missing: tuple[MissingRank, ...]

    @property
    def comm(self) -> str:
        """The ``comm`` label: the Inspector's form of the hash ("0x5f4a2b1c9d8e7f")."""
        return comm_id(self.hash)


@dataclass(frozen=True)
class Status:
    nccl_version: str
    communicators: tuple[Communicator, ...]
    collection_seconds: float
    timeouts: int


def parse_status(document: dict[str, Any]) -> Status:
    """The status, or RasError naming the first field that is missing or of the wrong type.

    Whatever the document, the only exception is RasError: a parser failure is a failed query
    (counted), never a failed collector (issue 46)."""
    try:
        return _status(document)
    except RasError:
        raise
    except (RecursionError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise RasError(f"status: cannot be read ({type(exc).__name__}: {exc})") from exc


def _status(document: dict[str, Any]) -> Status:
    communicators = _list(document, "communicators", "")
    ras = document.get("ras")
    if not isinstance(ras, dict):
        raise RasError("status: no 'ras' object")
    return Status(
        nccl_version=_str(document, "nccl_version", ""),
        communicators=tuple(_communicator(c, f"communicators[{i}]") for i, c in enumerate(communicators)),
        collection_seconds=_number(ras, "collection_time_sec", "ras"),
        timeouts=_int(ras, "timeouts_count", "ras"),
    )


def _communicator(obj: Any, where: str) -> Communicator:
    if not isinstance(obj, dict):
        raise RasError(f"status: {where} is not an object")
    ranks = tuple(_rank(r, f"{where}.ranks[{i}]") for i, r in enumerate(_list(obj, "ranks", where)))
    missing = tuple(
        _missing(r, f"{where}.missing_ranks[{i}]") for i, r in enumerate(_list(obj, "missing_ranks", where))
    )
    return Communicator(hash=_str(obj, "hash", where), size=_int(obj, "size", where), ranks=ranks, missing=missing)


def _rank(obj: Any, where: str) -> Rank:
    if not isinstance(obj, dict):
        raise RasError(f"status: {where} is not an object")
    status = obj.get("status")
    counts = obj.get("collective_counts")
    if not isinstance(status, dict) or not isinstance(counts, dict):
        raise RasError(f"status: {where} has no 'status' or 'collective_counts' object")
    return Rank(
        rank=_int(obj, "rank", where),
        host=_str(obj, "host", where),
        pid=_int(obj, "pid", where),
        nvml_dev=_int(obj, "nvml_dev", where),
        init_state=_int(status, "init_state", where),
        async_error=_int(status, "async_error", where),
        finalize_called=_bool(status, "finalize_called", where),
        destroy_flag=_bool(status, "destroy_flag", where),
        abort_flag=_bool(status, "abort_flag", where),
        counts={name: _int(counts, name, f"{where}.collective_counts") for name in COLLECTIVES},
    )


def _missing(obj: Any, where: str) -> MissingRank:
    if not isinstance(obj, dict) or not isinstance(obj.get("status"), dict):
        raise RasError(f"status: {where} is not an object with a 'status'")
    return MissingRank(
        rank=_int(obj, "rank", where),
        host=_str(obj, "host", where),
        pid=_int(obj, "pid", where),
        nvml_dev=_int(obj, "nvml_dev", where),
        unresponsive=_bool(obj["status"], "unresponsive", where),
        dead=_bool(obj["status"], "considered_dead", where),
    )


def _field(obj: dict[str, Any], key: str, where: str, kind: str) -> RasError:
    return RasError(f"status: {where + '.' if where else ''}{key} is missing or not {kind}")


def _int(obj: dict[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _field(obj, key, where, "an integer")
    return value


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _field(obj, key, where, "a number")
    return float(value)


def _bool(obj: dict[str, Any], key: str, where: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise _field(obj, key, where, "true or false")
    return value


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or len(value) > MAX_LABEL_LENGTH:
        raise _field(obj, key, where, "a string")
    return value


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise _field(obj, key, where, "a list")
    return value
