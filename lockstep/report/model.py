"""What a report says, as data: the dataclasses every renderer reads, and their JSON.

The JSON is the stored form (the epilog's file) and `--format json`; its schema is versioned
(SCHEMA) and documented field by field in docs/report.md.  A change that removes or renames a
field, or changes its meaning, is a new version; adding a field is not.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

SCHEMA = "lockstep.report/v1"


class ReportError(Exception):
    """A report cannot be made: the message is one line for the user.  (Here, with the data,
    rather than beside the HTTP client: the agent's CLI reads the report's flags and store
    without loading an HTTP client, issue 47.)"""


@dataclass
class Job:
    job_id: str
    cluster: str
    state: str  # "running" or "ended"
    start: float  # unix seconds: the first sample of the job's series
    end: float  # the last one (a running job: now)
    duration_seconds: float
    user: str = ""
    account: str = ""
    partition: str = ""
    job_name: str = ""
    nodes: list[str] = field(default_factory=list)  # the agents (instance labels) that saw the job
    hosts: list[str] = field(default_factory=list)  # the host names the job's ranks ran on
    ranks: int = 0
    gpus: int = 0


@dataclass
class Gpu:
    node: str
    gpu: str
    uuid: str
    utilization_avg: float | None = None  # 0..1 over the job
    memory_peak_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_avg_watts: float | None = None
    power_max_watts: float | None = None
    throttle_seconds: dict[str, float] = field(default_factory=dict)  # clock event reason -> seconds
    xid_errors: dict[str, float] = field(default_factory=dict)  # xid -> count in the job
    ecc_errors: dict[str, float] = field(default_factory=dict)  # type -> count in the job
    idle: bool = False  # allocated to the job but below GPU_IDLE_ACTIVITY_RATIO on average


@dataclass
class Point:
    t: float
    value: float


@dataclass
class Interval:
    start: float
    end: float
    seconds: float


@dataclass
class Steps:
    source: str = ""  # "training" (lockstep_training_*), "framework" (lockstep_framework_*) or "" (none)
    steps: float = 0  # steps completed in the job (all ranks in step: the most any rank did)
    median_step_seconds: float | None = None
    timeline: list[Point] = field(default_factory=list)  # wall seconds per step
    stalls: list[Interval] = field(default_factory=list)  # no step for TRAINING_STALL_WINDOW or longer
    tokens_per_second: list[Point] = field(default_factory=list)
    last_step: float | None = None


@dataclass
class Straggler:
    kind: str  # "training" (a rank's own work per step), "nccl" (a rank its communicator waits for)
    rank: str
    host: str = ""
    node: str = ""  # the agent that reported the rank
    gpu: str = ""
    comm: str = ""
    start: float = 0.0
    end: float = 0.0
    seconds: float = 0.0  # how long it was held responsible
    ratio: float = 0.0  # training: its work per step over the median rank's; nccl: its peers' wait share
    share_lost: float = 0.0  # share of the job's wall time lost waiting for it
    # The straggler rules' suspects on its node (lockstep/suspects.py names: "pfc_pause", ...), as
    # the alert names them, and what each showed there (a line per port, mount, GPU, ...).
    suspects: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)


@dataclass
class CheckpointRoot:
    root: str
    node: str
    saves: float = 0
    expected_interval_seconds: float | None = None
    cadence_seconds: float | None = None  # median time between completed saves in the job
    durations_seconds: list[float] = field(default_factory=list)  # each completed save seen, in order
    stalls: list[Interval] = field(default_factory=list)  # a save in progress for longer than allowed
    last_success: float | None = None
    work_at_risk_seconds: float | None = None  # from the last completed save to the job's end


@dataclass
class Hang:
    alert: str
    start: float
    rank: str = ""
    host: str = ""
    gpu: str = ""
    detail: str = ""


@dataclass
class PostMortem:
    """Which rank stopped first: the earliest last step, or the rank furthest behind in NCCL."""

    rank: str
    host: str = ""
    gpu: str = ""
    stopped_at: float | None = None
    how: str = ""


@dataclass
class Alert:
    alertname: str
    severity: str
    start: float
    end: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Event:
    kind: str  # "fabric" or "filesystem"
    node: str
    what: str
    count: float = 0
    detail: str = ""


@dataclass
class Report:
    job: Job
    verdict: str
    generated_at: float
    prometheus: str = ""
    grafana_url: str = ""
    gpus: list[Gpu] = field(default_factory=list)
    steps: Steps = field(default_factory=Steps)
    stragglers: list[Straggler] = field(default_factory=list)
    checkpoints: list[CheckpointRoot] = field(default_factory=list)
    hangs: list[Hang] = field(default_factory=list)
    post_mortem: PostMortem | None = None
    alerts: list[Alert] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    schema: str = SCHEMA


def to_dict(report: Report) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    return {"schema": data.pop("schema"), **data}


def to_json(report: Report, compact: bool = False) -> str:
    if compact:
        return json.dumps(to_dict(report), separators=(",", ":"), sort_keys=False)
    return json.dumps(to_dict(report), indent=2) + "\n"


def from_json(text: str) -> Report:
    """A report read back (the stored file); ValueError when it is not one of this schema."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"not a {SCHEMA} report (schema: {found!r})")
    return _build(Report, data)


def _build(kind: Any, value: Any) -> Any:
    origin = typing.get_origin(kind)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = typing.get_type_hints(kind)
        known = {f.name for f in dataclasses.fields(kind)}
        return kind(**{k: _build(hints[k], v) for k, v in value.items() if k in known})
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        return _build(inner[0], value)
    if origin is list:
        (item,) = typing.get_args(kind)
        return [_build(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(kind)
        return {str(k): _build(item, v) for k, v in value.items()}
    if kind is float:
        return float(value)
    return value
