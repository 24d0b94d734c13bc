"""One line of a rank's metric log into a ``Record``, or ``BadLine`` saying why it is invalid.

A line is one JSON object holding one metric (the format of lockstep/emitter.py and of
docs/workloads.md).  Only the metrics a step is made of (steps.py) become records; other
metrics (loss, gpu_utilization_pct, ...) are valid and ignored.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

# Longest accepted label value (job_id, host): a guard against garbage making huge series.
MAX_LABEL_LENGTH = 128

# The record metrics steps are made of (steps.py); records of any other metric are ignored.
STEP_TIME = "step_time_sec"
_KNOWN = frozenset(
    {
        STEP_TIME,
        "compute_time_sec",
        "comm_wait_time_sec",
        "allreduce_time_sec",
        "allreduce_time_pct",
        "data_time_sec",
        "tokens",
        "tokens_per_sec",
        "samples",
        "throughput_examples_per_sec",
        "samples_per_sec",
    }
)
_JOB_IN_PATH = re.compile(r"job=([^/]+?)(?:__|/|$)")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")


class BadLine(ValueError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Record:
    rank_key: tuple[str, str, str]  # (job_id, rank, host): the labels
    step_key: str
    metric: str
    value: float
    ts: float


# The largest value a record may carry: more than any step's seconds, tokens or samples.  A
# larger one (1e308) is not a measurement, and summed it would make a counter +Inf for good.
MAX_RECORD_VALUE = 1e15
# Unix seconds up to the year 10000: anything larger is not a time.
MAX_TIMESTAMP = 253402300800.0
MAX_RANK = 10_000_000


def _in_range(value: Any, maximum: float) -> bool:
    """A JSON number from 0 to ``maximum``; compared before any float() (a 400-digit integer
    overflows float(), and math.isfinite() of it raises)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return 0 <= value <= maximum  # False for NaN; exact for integers of any size


def parse_timestamp(value: Any) -> float:
    """'2026-01-02T00:00:01.600Z' (RFC 3339, any offset) or Unix seconds -> Unix seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not _in_range(value, MAX_TIMESTAMP):
            raise BadLine("bad_record")
        return float(value)
    if not isinstance(value, str):
        raise BadLine("bad_record")
    return _parse_timestamp_text(value)


@functools.lru_cache(maxsize=4096)  # the records of one step share their ts
def _parse_timestamp_text(value: str) -> float:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"  # Python 3.10's fromisoformat does not take Z
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadLine("bad_record") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def parse_record(data: bytes, path: str) -> Record | None:
    """One log line -> a Record, None for a valid record of a metric we do not use.

    job_id and rank come from the record, else from the path (``...job=4242...`` and
    ``rank-003...``), as in the record format's file layout.
    """
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise BadLine("not_json") from None
    if not isinstance(obj, dict):
        raise BadLine("not_json")
    metric = obj.get("metric")
    if not isinstance(metric, str) or "value" not in obj or "ts" not in obj:
        raise BadLine("bad_record")
    if metric not in _KNOWN:
        return None
    value = obj["value"]
    if not _in_range(value, MAX_RECORD_VALUE):
        raise BadLine("bad_value")
    ts = parse_timestamp(obj["ts"])
    job_id = obj.get("job_id")
    if job_id is None:
        match = _JOB_IN_PATH.search(path)
        job_id = match.group(1) if match else None
    rank = obj.get("rank")
    if rank is None:
        match = _RANK_IN_NAME.search(path.rsplit("/", 1)[-1])
        rank = int(match.group(1)) if match else None
    host = obj.get("host", "")
    if isinstance(rank, str) and rank.isdigit():
        rank = int(rank)
    if (
        not isinstance(job_id, (str, int))
        or isinstance(job_id, bool)
        or not isinstance(rank, int)
        or isinstance(rank, bool)
        or rank < 0
        or rank > MAX_RANK
        or not isinstance(host, str)
        or len(str(job_id)) > MAX_LABEL_LENGTH
        or len(host) > MAX_LABEL_LENGTH
        or str(job_id) == ""
    ):
        raise BadLine("bad_record")
    step = obj.get("step")
    step_key = f"step:{step}" if isinstance(step, (int, str)) and not isinstance(step, bool) else f"ts:{obj['ts']}"
    return Record((str(job_id), str(rank), host), step_key, metric, float(value), ts)
