"""What each straggler's node (and its GPUs of the job) showed while it straggled: the straggler
rules' suspects (lockstep/suspects.py), so that the report never contradicts the alert.

Which suspects: where Prometheus records the shipped rules (the rank suspects' slow-rank source
exists for the job), those the rules recorded while the rank straggled: its node's
(NODE_SUSPECT), a throttled GPU of its job there (GPU_THROTTLE) and its rank's (RANK_SUSPECT,
NCCL_RANK_SUSPECT), so every suspect a straggler alert names is named; the rank's data wait,
which the rules record only for ranks slow over 30 minutes, is also judged here by the same
definition.  Where Prometheus records no rule, the report judges the same clauses itself.

What they showed: each suspect's clauses evaluated on the straggler's node over the time it
straggled (and one timeline window before), a line per series that holds ("PFC pause on
ens3f0np0 priority 3 12% of the time"); a recorded suspect none of whose series holds over that
span (the rules judge 30-minute windows) is said as the rules named it.
"""

from __future__ import annotations

import statistics

from lockstep.report.model import Straggler
from lockstep.report.prometheus import Sample
from lockstep.report.scope import Scope, agent_of_host, duration, quote
from lockstep.suspects import (
    DATA_WAIT_SHARE,
    GPU_THROTTLE,
    GPU_THROTTLE_CLAUSE,
    NCCL_RANK_SUSPECT,
    NCCL_SLOW_RANK_SOURCE,
    NODE_SUSPECT,
    NODE_SUSPECTS,
    RANK_SUSPECT,
    RANK_SUSPECT_NAMES,
    SLOW_RANK_SOURCE,
    Clause,
    render,
)


def evidence(scope: Scope, straggler: Straggler) -> None:
    """Set the straggler's suspects (names) and evidence (a line for each thing seen), and, for a
    training straggler whose GPU is not known, the throttled GPU of its job on its node."""
    # The rank's host may be another agent's node (its logs read elsewhere): that agent's series.
    instance = agent_of_host(scope, straggler.host) or straggler.node
    length = max(straggler.end - straggler.start, 0) + scope.window
    w = duration(length)
    node = node_matchers(scope, instance) if instance else ""
    seen, throttled_gpu = seen_on_node(scope, straggler, instance, node, w) if instance else ({}, "")
    recorded = recorded_suspects(scope, straggler, node, w)
    if recorded is None:
        names = set(seen)
    else:
        # The data wait is the rank's own (the rules record it only for ranks slow over 30
        # minutes): judged here by the same definition wherever the rules did not record it.
        names = recorded | ({"data_wait"} & set(seen))
    straggler.suspects = [name for name in RANK_SUSPECT_NAMES if name in names]
    if "gpu_throttle" in straggler.suspects and not straggler.gpu and straggler.kind == "training":
        straggler.gpu = throttled_gpu  # (which GPU runs which rank is not known: the throttled one)
    straggler.evidence = [
        line
        for name in straggler.suspects
        for line in seen.get(name) or [f"{name.replace('_', ' ')} (named by the straggler rules)"]
    ]


def node_matchers(scope: Scope, instance: str) -> str:
    """The matchers of one agent's series (its instance, and the job's cluster when one)."""
    cluster = f", cluster={quote(scope.cluster)}" if scope.cluster is not None else ""
    return f"instance={quote(instance)}{cluster}"


def recorded_suspects(scope: Scope, straggler: Straggler, node: str, w: str) -> set[str] | None:
    """The suspects the rules recorded over ``w`` before the straggler's end: its node's
    (NODE_SUSPECT), a throttled GPU of its job there (GPU_THROTTLE), and those recorded for its
    rank (RANK_SUSPECT, NCCL_RANK_SUSPECT: what the straggler alerts name, a subset of the
    first two but for the data wait); None where Prometheus records no straggler rule for the job."""
    if straggler.kind == "nccl":
        source, record, extra = NCCL_SLOW_RANK_SOURCE, NCCL_RANK_SUSPECT, {"comm": straggler.comm}
    else:
        source, record, extra = SLOW_RANK_SOURCE, RANK_SUSPECT, {}
    if source not in scope.recorded:
        scope.recorded[source] = bool(scope.prom.series(scope.job(source), scope.start - scope.step, scope.end))
    if not scope.recorded[source]:
        return None
    rank = scope.job(record, f"rank={quote(straggler.rank)}", **extra)
    names = {s.labels.get("suspect", "") for s in ask_max(scope, rank, w, straggler.end)}
    if node:
        names |= {s.labels.get("suspect", "") for s in ask_max(scope, f"{NODE_SUSPECT}{{{node}}}", w, straggler.end)}
        job_gpus = f"lockstep_slurm_job_gpu_info{{{node}, job_id={quote(scope.job_id)}}}"
        throttled = f"max by (uuid) (max_over_time({GPU_THROTTLE}{{{node}}}[{w}])) and on (uuid) {job_gpus}"
        if scope.prom.query(throttled, straggler.end):
            names.add("gpu_throttle")
    return names


def ask_max(scope: Scope, selector: str, w: str, at: float) -> list[Sample]:
    """Each suspect recorded in the selector's series at any time of the window."""
    return scope.prom.query(f"max by (suspect) (max_over_time({selector}[{w}]))", at)


def seen_on_node(
    scope: Scope, straggler: Straggler, instance: str, node: str, w: str
) -> tuple[dict[str, list[str]], str]:
    """Each suspect the node showed over ``w`` before the straggler's end, by the suspects'
    clauses and thresholds: a line per series that holds; and the first throttled GPU of the job
    there ("" for none)."""
    seen: dict[str, list[str]] = {}
    for suspect in NODE_SUSPECTS:
        lines = [line for clause in suspect.clauses for line in holding(scope, clause, node, w, straggler.end)]
        if lines:
            seen[suspect.name] = lines
    throttled = gpu_throttle(scope, straggler, instance, node, w)
    if throttled:
        seen["gpu_throttle"] = [line for _, line in throttled]
    if straggler.kind == "training":
        data_wait = data_wait_evidence(scope, straggler, w)
        if data_wait:
            seen["data_wait"] = data_wait
    return seen, throttled[0][0] if throttled else ""


def holding(scope: Scope, clause: Clause, node: str, w: str, at: float) -> list[str]:
    """A line for each series of the clause that holds at ``at`` (its value a share of time
    divided by the time scale where it is one)."""
    lines = []
    for s in scope.prom.query(render(clause.expr, node, w), at):
        value = s.value / scope.scale if clause.per_second else s.value
        if clause.holds(value):
            lines.append(clause.say(s.labels, value))
    return lines


def gpu_throttle(scope: Scope, straggler: Straggler, instance: str, node: str, w: str) -> list[tuple[str, str]]:
    """The GPUs of the job on the node throttled by a slowdown reason (the rules' suspect: which
    GPU runs which rank is not known), each with its line."""
    job_gpus = {
        labels.get("uuid", ""): labels.get("gpu", "")
        for labels in scope.series_of("lockstep_slurm_job_gpu_info")
        if labels.get("instance") == instance
    }
    lines = []
    for s in scope.prom.query(render(GPU_THROTTLE_CLAUSE.expr, node, w), straggler.end):
        gpu = job_gpus.get(s.labels.get("uuid", ""))
        if gpu is not None and GPU_THROTTLE_CLAUSE.holds(s.value):
            lines.append((gpu, GPU_THROTTLE_CLAUSE.say({**s.labels, "gpu": gpu}, s.value)))
    return lines


def data_wait_evidence(scope: Scope, straggler: Straggler, w: str) -> list[str]:
    """The rank's data wait per step above its job's median rank's by more than DATA_WAIT_SHARE
    of its excess time per step (the rules' data_wait suspect)."""
    by = "(rank)"
    steps = f"sum by {by} (rate({scope.job('lockstep_training_steps_total')}[{w}]))"
    data = scope.prom.query(
        f"sum by {by} (rate({scope.job('lockstep_training_data_wait_seconds_total')}[{w}])) / ({steps} > 0)",
        straggler.end,
    )
    work = scope.prom.query(
        f"(sum by {by} (rate({scope.job('lockstep_training_compute_seconds_total')}[{w}]))"
        f" + sum by {by} (rate({scope.job('lockstep_training_data_wait_seconds_total')}[{w}]))) / ({steps} > 0)",
        straggler.end,
    )
    data_of = {s.labels.get("rank"): s.value for s in data}
    work_of = {s.labels.get("rank"): s.value for s in work}
    if straggler.rank not in data_of or straggler.rank not in work_of or len(work_of) < 2:
        return []
    excess = work_of[straggler.rank] - statistics.median(work_of.values())
    extra_wait = data_of[straggler.rank] - statistics.median(data_of.values())
    if excess > 0 and extra_wait > DATA_WAIT_SHARE * excess:
        return [f"data loader: {extra_wait:.3g} s more data wait per step than the median rank"]
    return []
