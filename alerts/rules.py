"""Lockstep's Prometheus recording and alerting rules: the one source the rule files are made from.

`python -m alerts --write` renders this module into alerts/lockstep-recording.rules.yml,
alerts/lockstep-alerts.rules.yml and deploy/prometheusrule.yaml; tests/test_alert_rules.py
fails when those files differ from what this module renders.  Every number comes from
alerts/thresholds.py, which the dashboards read too.

Recording rules are named level:metric:operations: the level is what a series is per (job_rank,
job_gpu, job, server, root, port, interface, mountpoint, instance), the metric what it
measures, the operations how it was made (mean5m: a per-step mean over 5 minutes from two
counters' rates; ratio_to_median5m: divided by the job's median).

Alert annotations are Go templates, evaluated by Prometheus: {{ $labels.x }} and {{ $value }}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

import yaml

from alerts import thresholds as T

RULE_FILES = {
    "recording": "alerts/lockstep-recording.rules.yml",
    "alerting": "alerts/lockstep-alerts.rules.yml",
}
PROMETHEUS_RULE = "deploy/prometheusrule.yaml"


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    # Static labels the rule adds (rules recording the same name tell their series apart by them).
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Alert:
    name: str
    severity: str  # critical: act now, the job or node is broken; warning: degraded, look today
    for_: str  # how long the condition must hold before the alert fires ("0m": at once)
    expr: str
    summary: str
    description: str
    # Further annotations (name, Go template), after summary and description.
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def runbook_anchor(self) -> str:
        """The anchor GitHub gives the alert's '## <name>' heading in docs/runbooks.md."""
        return self.name.lower()


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Recording, ...] | tuple[Alert, ...]


# --- PromQL helpers ------------------------------------------------------------------------------


def by(*labels: str) -> str:
    """by (...) over the target labels and the given ones: aggregations keep where it happened."""
    return f"by ({', '.join((*T.TARGET_LABELS, *labels))})"


def on(*labels: str) -> str:
    return f"on ({', '.join((*T.TARGET_LABELS, *labels))})"


def job_by() -> str:
    """A job spans nodes: per-job aggregations are by cluster and job id only."""
    return "by (cluster, job_id)"


JOB_ON = "on (cluster, job_id)"


def num(value: float) -> str:
    """A threshold as PromQL writes it: 0.9, 2, 0.016666..."""
    return repr(float(value)).removesuffix(".0")


def regex(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def label(name: str) -> str:
    return "{{ $labels." + name + " }}"


# Where an alert fired: the Kubernetes node name when the scrape adds it, else the instance.
WHERE = "{{ with $labels.node }}{{ . }}{{ else }}{{ $labels.instance }}{{ end }}"
VALUE = "{{ $value }}"
VALUE_PERCENT = "{{ $value | humanizePercentage }}"
VALUE_DURATION = "{{ $value | humanizeDuration }}"
VALUE_2F = '{{ printf "%.2f" $value }}'


def percent(ratio: float) -> str:
    return f"{ratio * 100:g} %"


# --- Recording rules -----------------------------------------------------------------------------


def _per_step(seconds_counter: str, name: str) -> Recording:
    """Mean seconds per training step over 5 minutes, per rank: rate(seconds) / rate(steps)."""
    return Recording(
        f"job_rank:lockstep_training_{name}_seconds:mean5m",
        f"rate({seconds_counter}[5m])\n/ (rate(lockstep_training_steps_total[5m]) > 0)",
    )


TRAINING_RECORDING = Group(
    "lockstep-training.recording",
    (
        _per_step("lockstep_training_step_seconds_total", "step"),
        _per_step("lockstep_training_compute_seconds_total", "compute"),
        _per_step("lockstep_training_comm_wait_seconds_total", "comm_wait"),
        _per_step("lockstep_training_data_wait_seconds_total", "data_wait"),
        # Wall step time is the same for every rank of a synchronous job; compute time is what
        # singles out the slow one, so the peer comparison is on compute.
        Recording(
            "job:lockstep_training_compute_seconds:median5m",
            f"quantile {job_by()} (0.5, job_rank:lockstep_training_compute_seconds:mean5m)",
        ),
        Recording(
            "job_rank:lockstep_training_compute_seconds:ratio_to_median5m",
            "job_rank:lockstep_training_compute_seconds:mean5m\n"
            f"/ {JOB_ON} group_left ()\njob:lockstep_training_compute_seconds:median5m",
        ),
        Recording("job:lockstep_training_ranks:count", f"count {job_by()} (lockstep_training_steps_total)"),
        Recording("job:lockstep_training_steps:rate5m", f"max {job_by()} (rate(lockstep_training_steps_total[5m]))"),
    ),
)

# GPM activity (Hopper and newer), per GPU or MIG GPU instance, over 5 minutes: the ratio of the
# counters' rates where the driver has the counters, else the windowed gauge's average.
SM_ACTIVE = "gpu:lockstep_gpu_sm_active:ratio5m"
TENSOR_ACTIVE = "gpu:lockstep_gpu_tensor_active:ratio5m"

GPU_RECORDING = Group(
    "lockstep-gpu.recording",
    (
        Recording(
            SM_ACTIVE,
            "rate(lockstep_gpu_sm_active_cycles_total[5m])\n/ (rate(lockstep_gpu_sm_cycles_total[5m]) > 0)\n"
            "or\navg_over_time(lockstep_gpu_sm_active_ratio[5m])",
        ),
        Recording(
            TENSOR_ACTIVE,
            'sum without (pipe) (rate(lockstep_gpu_pipe_active_cycles_total{pipe="tensor"}[5m]))\n'
            "/ (rate(lockstep_gpu_sm_cycles_total[5m]) > 0)\n"
            'or\nsum without (pipe) (avg_over_time(lockstep_gpu_pipe_active_ratio{pipe="tensor"}[5m]))',
        ),
        # The SM clock of each busy GPU of each Slurm job (a GPU shared by two jobs is in both).
        Recording(
            "job_gpu:lockstep_gpu_sm_clock_hertz:avg5m",
            f"lockstep_slurm_job_gpu_info\n* {on('uuid')} group_left ()\n"
            "(\n  avg_over_time(lockstep_gpu_sm_clock_hertz[5m])\n"
            f"  and avg_over_time(lockstep_gpu_utilization_ratio[5m]) > {num(T.GPU_STRAGGLER_MIN_UTILIZATION)}\n)",
        ),
        Recording(
            "job:lockstep_gpu_sm_clock_hertz:median5m",
            f"quantile {job_by()} (0.5, job_gpu:lockstep_gpu_sm_clock_hertz:avg5m)",
        ),
        Recording(
            "job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m",
            "job_gpu:lockstep_gpu_sm_clock_hertz:avg5m\n"
            f"/ {JOB_ON} group_left ()\njob:lockstep_gpu_sm_clock_hertz:median5m",
        ),
        Recording("job:lockstep_gpus_busy:count", f"count {job_by()} (job_gpu:lockstep_gpu_sm_clock_hertz:avg5m)"),
    ),
)

TOKENS_RATE = "server:lockstep_inference_generation_tokens:rate5m"
TTFT_P95 = "server:lockstep_inference_time_to_first_token_seconds:p95_5m"
FINISHED_RATE = "server:lockstep_inference_requests_finished:rate5m"
FAILED_RATIO = "server:lockstep_inference_requests_failed:ratio5m"
FAILED_REASONS = "abort|error"
SUCCESS_REASONS = "stop|length"

INFERENCE_RECORDING = Group(
    "lockstep-inference.recording",
    (
        Recording(
            "server:lockstep_inference_kv_cache_usage_ratio:avg5m",
            "avg_over_time(lockstep_inference_kv_cache_usage_ratio[5m])",
        ),
        Recording(
            "server:lockstep_inference_requests_waiting:avg5m",
            "avg_over_time(lockstep_inference_requests_waiting[5m])",
        ),
        Recording("server:lockstep_inference_preemptions:rate5m", "rate(lockstep_inference_preemptions_total[5m])"),
        Recording(TOKENS_RATE, "rate(lockstep_inference_generation_tokens_total[5m])"),
        # No quantile where no request got its first token in the window (it would be NaN).
        Recording(
            TTFT_P95,
            "histogram_quantile(0.95, rate(lockstep_inference_time_to_first_token_seconds_bucket[5m]))\n"
            "and rate(lockstep_inference_time_to_first_token_seconds_count[5m]) > 0",
        ),
        Recording(FINISHED_RATE, "sum without (reason) (rate(lockstep_inference_requests_finished_total[5m]))"),
        # Only where the engine counts its successful requests by reason too (vLLM): SGLang, TGI,
        # Triton and Dynamo count only their failures, whose share of themselves is always 1.
        Recording(
            FAILED_RATIO,
            "(\n"
            "  sum without (reason) (\n"
            f'    rate(lockstep_inference_requests_finished_total{{reason=~"{FAILED_REASONS}"}}[5m])\n  )\n'
            f"  or 0 * {FINISHED_RATE}\n)\n"
            f"/ ({FINISHED_RATE} > 0)\n"
            f'and group without (reason) (lockstep_inference_requests_finished_total{{reason=~"{SUCCESS_REASONS}"}})',
        ),
    ),
)

STORAGE_RECORDING = Group(
    "lockstep-storage.recording",
    (
        Recording(
            "root:lockstep_checkpoint_last_success_timestamp_seconds:age",
            "time() - lockstep_checkpoint_last_success_timestamp_seconds",
        ),
        # Roots configured without expected_interval get the default one.
        Recording(
            "root:lockstep_checkpoint_expected_interval_seconds:or_default",
            "lockstep_checkpoint_expected_interval_seconds\n"
            f"or (0 * lockstep_checkpoint_root_readable + {T.CHECKPOINT_DEFAULT_INTERVAL_SECONDS})",
        ),
        Recording(
            "mountpoint:lockstep_filesystem_available_bytes:ratio",
            "lockstep_filesystem_available_bytes / (lockstep_filesystem_size_bytes > 0)",
        ),
        Recording(
            "instance:lockstep_host_io_full_pressure:ratio5m",
            'rate(lockstep_host_pressure_stalled_seconds_total{resource="io", kind="full"}[5m])',
        ),
    ),
)

FABRIC_RECORDING = Group(
    "lockstep-fabric.recording",
    (
        Recording(
            "port:lockstep_ib_port_transmit_wait:ratio5m",
            "rate(lockstep_ib_port_transmit_wait_total[5m])\n"
            "/ (\n  rate(lockstep_ib_port_transmit_wait_total[5m])\n"
            "  + rate(lockstep_ib_port_transmitted_bytes_total[5m]) / 4\n  > 0\n)",
        ),
        Recording("interface:lockstep_pfc_pause_seconds:ratio5m", "rate(lockstep_pfc_pause_seconds_total[5m])"),
    ),
)

# The fleet dashboard's panels over every GPU of every node: at 1,024 nodes (8,192 GPUs) the raw
# queries over its default 3 hours take seconds (docs/performance.md), these a few milliseconds.
FLEET_RECORDING = Group(
    "lockstep-fleet.recording",
    (
        Recording("cluster:lockstep_gpu_up:sum", "sum by (cluster) (lockstep_gpu_up)"),
        Recording("cluster:lockstep_gpu_utilization_ratio:avg", "avg by (cluster) (lockstep_gpu_utilization_ratio)"),
        Recording("instance:lockstep_gpu_utilization_ratio:avg", f"avg {by()} (lockstep_gpu_utilization_ratio)"),
    ),
)

# --- Sustained stragglers: 30-minute means against the job's median and MAD -------------------

W = T.STRAGGLER_SUSTAINED_WINDOW
TARGET = ", ".join(T.TARGET_LABELS)
WORK = "lockstep_training_work_seconds"  # compute + data wait per step: the rank's own time


def _work_per_step(window: str) -> Recording:
    """The rank's own time per step (not waiting for its peers): compute plus data wait.  A rank
    starved by its loader is as slow as one with a slow GPU; ranks that report no data wait
    count compute alone."""
    return Recording(
        f"job_rank:{WORK}:mean{window}",
        f"(\n  rate(lockstep_training_compute_seconds_total[{window}])\n"
        f"  + (rate(lockstep_training_data_wait_seconds_total[{window}])"
        f" or 0 * rate(lockstep_training_compute_seconds_total[{window}]))\n)\n"
        f"/ (rate(lockstep_training_steps_total[{window}]) > 0)",
    )


def _median_and_mad(level: str, metric: str, window: str) -> tuple[Recording, ...]:
    """The job's median of a per-rank (per-GPU) series, its median absolute deviation, and each
    member's ratio to the median."""
    member = f"{level}:{metric}:{'avg' if level == 'job_gpu' else 'mean'}{window}"
    median = f"job:{metric}:median{window}"
    return (
        Recording(median, f"quantile {job_by()} (0.5, {member})"),
        Recording(
            f"job:{metric}:mad{window}",
            f"quantile {job_by()} (\n  0.5,\n  abs({member} - {JOB_ON} group_left () {median})\n)",
        ),
        Recording(f"{level}:{metric}:ratio_to_median{window}", f"{member}\n/ {JOB_ON} group_left ()\n{median}"),
    )


def _gpu_pace(window: str) -> str:
    """What a busy GPU's pace is measured by: its SM clock, averaged over the window.

    Not GPM's SM activity (issue 13 looked at it): in synchronous training the slow GPU is
    the *busiest* (its peers wait for it in NCCL kernels, which hold only a few SMs), and a GPU
    stalled on memory or NVLink keeps its warps resident, so its SM activity stays high too.
    Activity says how much of a GPU a job uses (LockstepGPUIdleWhileAllocated, the dashboards),
    not which GPU is slow; a GPU that keeps its clock but does less work shows in its rank's
    time per step (the training straggler rules)."""
    return (
        f"lockstep_slurm_job_gpu_info\n* {on('uuid')} group_left ()\n"
        f"(\n  avg_over_time(lockstep_gpu_sm_clock_hertz[{window}])\n"
        f"  and avg_over_time(lockstep_gpu_utilization_ratio[{window}]) > {num(T.GPU_STRAGGLER_MIN_UTILIZATION)}\n)"
    )


def _suspect(record: str, name: str, expr: str) -> Recording:
    """A suspect series: 1 where expr has a sample, labelled suspect=<name> by the rule."""
    return Recording(record, expr, (("suspect", name),))


INSTANCE_SUSPECT = f"instance:lockstep_straggler_suspect:active{W}"
HOST_SUSPECT = f"host:lockstep_straggler_suspect:active{W}"
RANK_SUSPECT = f"job_rank:lockstep_training_suspect:active{W}"
GPU_THROTTLE = f"gpu:lockstep_gpu_clock_event_active:avg{W}"
HOST_INFO = "instance:lockstep_host:info"
SLOWDOWN_REASONS = regex(T.SUSPECT_GPU_THROTTLE_REASONS)

# Node-wide suspects: (name, PromQL that has a sample per target where the node shows it).
NODE_SUSPECTS = (
    (
        "ib_errors",
        f"rate(lockstep_ib_port_symbol_errors_total[{W}]) > 0\n"
        f"    or rate(lockstep_ib_port_link_error_recovery_total[{W}]) > 0\n"
        f"    or rate(lockstep_ib_port_link_downed_total[{W}]) > 0\n"
        f"    or rate(lockstep_ib_port_receive_errors_total[{W}]) > 0\n"
        f"    or min_over_time(lockstep_ib_port_state[{W}]) < 4",
    ),
    (
        "ib_congestion",
        f"rate(lockstep_ib_port_transmit_wait_total[{W}])\n"
        f"    / (rate(lockstep_ib_port_transmit_wait_total[{W}])"
        f" + rate(lockstep_ib_port_transmitted_bytes_total[{W}]) / 4 > 0)\n"
        f"    > {num(T.SUSPECT_IB_TRANSMIT_WAIT_RATIO)}",
    ),
    ("pfc_pause", f"rate(lockstep_pfc_pause_seconds_total[{W}]) > {num(T.SUSPECT_PFC_PAUSE_RATIO)}"),
    (
        "hung_mount",
        f"min_over_time(lockstep_filesystem_responsive[{W}]) == 0\n"
        f"    or rate(lockstep_nfs_major_timeouts_total[{W}]) > 0",
    ),
    (
        "cpu_pressure",
        f'rate(lockstep_host_pressure_stalled_seconds_total{{resource="cpu", kind="some"}}[{W}])'
        f" > {num(T.SUSPECT_CPU_PRESSURE_RATIO)}",
    ),
    (
        "io_pressure",
        f'rate(lockstep_host_pressure_stalled_seconds_total{{resource="io", kind="full"}}[{W}])'
        f" > {num(T.SUSPECT_IO_PRESSURE_RATIO)}",
    ),
)

# Ranks slow enough by the relative margin to be given suspects.
SLOW_RANKS = f"job_rank:{WORK}:ratio_to_median{W} > {num(T.TRAINING_STRAGGLER_SUSTAINED_RATIO)}"


def _rank_suspects() -> tuple[Recording, ...]:
    """Each slow rank gets its node's suspects.  A rank's series come from whichever agent reads
    its log (on a shared filesystem, maybe not its own node's), so the join is on the rank's
    host label, which instance:lockstep_host:info maps to the node's agent."""
    slow = f"group by ({TARGET}, job_id, rank, host) ({SLOW_RANKS})"
    rules = [
        _suspect(RANK_SUSPECT, name, f'{slow}\n* on (cluster, host) group_left ()\n{HOST_SUSPECT}{{suspect="{name}"}}')
        for name, _ in NODE_SUSPECTS
    ]
    # A throttled GPU of the same job on the rank's node (which GPU runs which rank is not known).
    rules.append(
        _suspect(
            RANK_SUSPECT,
            "gpu_throttle",
            f"{slow}\n* on (cluster, host, job_id) group_left ()\n"
            f"group by (cluster, host, job_id) (\n"
            f"  max by ({TARGET}, uuid) ({GPU_THROTTLE})\n"
            f"  * on ({TARGET}, uuid) group_right () lockstep_slurm_job_gpu_info\n"
            f"  * on (cluster, instance) group_left (host) {HOST_INFO}\n)",
        )
    )
    # The rank's own data wait explains most of its excess time.
    excess = f"(job_rank:{WORK}:mean{W} - {JOB_ON} group_left () job:{WORK}:median{W})"
    data_excess = (
        f"(job_rank:lockstep_training_data_wait_seconds:mean{W}"
        f" - {JOB_ON} group_left () job:lockstep_training_data_wait_seconds:median{W})"
    )
    rules.append(
        _suspect(
            RANK_SUSPECT,
            "data_wait",
            f"{slow}\nand on ({TARGET}, job_id, rank, host)\n"
            f"{data_excess}\n> {num(T.SUSPECT_DATA_WAIT_SHARE)} * {excess}",
        )
    )
    return tuple(rules)


STRAGGLER_RECORDING = Group(
    "lockstep-stragglers.recording",
    (
        _work_per_step("5m"),
        Recording(f"job:{WORK}:median5m", f"quantile {job_by()} (0.5, job_rank:{WORK}:mean5m)"),
        Recording(
            f"job_rank:{WORK}:ratio_to_median5m",
            f"job_rank:{WORK}:mean5m\n/ {JOB_ON} group_left ()\njob:{WORK}:median5m",
        ),
        _work_per_step(W),
        *_median_and_mad("job_rank", WORK, W),
        Recording(
            f"job_rank:lockstep_training_data_wait_seconds:mean{W}",
            f"rate(lockstep_training_data_wait_seconds_total[{W}])\n/ (rate(lockstep_training_steps_total[{W}]) > 0)",
        ),
        Recording(
            f"job:lockstep_training_data_wait_seconds:median{W}",
            f"quantile {job_by()} (0.5, job_rank:lockstep_training_data_wait_seconds:mean{W})",
        ),
        Recording(f"job_gpu:lockstep_gpu_sm_clock_hertz:avg{W}", _gpu_pace(W)),
        *_median_and_mad("job_gpu", "lockstep_gpu_sm_clock_hertz", W),
        # Suspects.  Which host each agent runs on, for ranks whose series another agent exports:
        # the Slurm node name, else the Kubernetes node name the scrape adds.
        # One agent per host (topk): the joins on it must find one, or PromQL refuses them.
        Recording(
            HOST_INFO,
            f"topk by (cluster, host) (\n  1,\n  max by ({TARGET}, host) (\n"
            '    label_replace(lockstep_slurm_node_info{slurm_node!=""}, "host", "$1", "slurm_node", "(.+)")\n'
            f"    or on (cluster, instance)\n"
            f'    label_replace(group by ({TARGET}) (lockstep_build_info{{node!=""}}), "host", "$1", "node", "(.+)")\n'
            "  )\n)",
        ),
        Recording(
            GPU_THROTTLE,
            f'avg_over_time(lockstep_gpu_clock_event_active{{reason=~"{SLOWDOWN_REASONS}"}}[{W}])'
            f" > {num(T.SUSPECT_GPU_THROTTLE_SHARE)}",
        ),
        *(_suspect(INSTANCE_SUSPECT, name, f"group {by()} (\n  {expr}\n)") for name, expr in NODE_SUSPECTS),
        Recording(
            HOST_SUSPECT,
            f"max by (cluster, host, suspect) (\n  {INSTANCE_SUSPECT}\n"
            f"  * on (cluster, instance) group_left (host) {HOST_INFO}\n)",
        ),
        *_rank_suspects(),
    ),
)

EXPECTED_INTERVAL = "root:lockstep_checkpoint_expected_interval_seconds:or_default"

RECORDING_GROUPS = (
    TRAINING_RECORDING,
    GPU_RECORDING,
    STRAGGLER_RECORDING,
    INFERENCE_RECORDING,
    STORAGE_RECORDING,
    FABRIC_RECORDING,
    FLEET_RECORDING,
)

# --- Alerts --------------------------------------------------------------------------------------

# --- What the straggler alerts say about suspects --------------------------------------------------
# Annotations run a query at evaluation (Prometheus' template function `query`), so the suspects
# are those of the moment the alert is sent, and a change of suspect does not make a new alert.


def _list(var: str, label_name: str) -> str:
    """A Go template listing label_name of the query results in var, comma-separated, by name."""
    return (
        f'{{{{ range $i, $s := sortByLabel "{label_name}" {var} }}}}{{{{ if $i }}}}, {{{{ end }}}}'
        f"{{{{ $s.Labels.{label_name} }}}}{{{{ end }}}}"
    )


RANK_SUSPECTS = (
    f'{{{{ $suspects := printf "{RANK_SUSPECT}{{cluster=%q, job_id=%q, rank=%q}}" '
    "$labels.cluster $labels.job_id $labels.rank | query }}"
    "{{ if $suspects }}" + _list("$suspects", "suspect") + "{{ else }}none found{{ end }}"
)
GPU_SUSPECTS = (
    f'{{{{ $throttle := printf "{GPU_THROTTLE}{{cluster=%q, instance=%q, uuid=%q}}" '
    "$labels.cluster $labels.instance $labels.uuid | query }}"
    f'{{{{ $node := printf "{INSTANCE_SUSPECT}{{cluster=%q, instance=%q}}" '
    "$labels.cluster $labels.instance | query }}"
    "{{ if $throttle }}gpu_throttle ("
    + _list("$throttle", "reason")
    + "){{ if $node }}, {{ end }}{{ end }}"
    + _list("$node", "suspect")
    + "{{ if not (or $throttle $node) }}none found{{ end }}"
)


def _dashboard_url(panel_id: int) -> str:
    return (
        f"{T.GRAFANA_URL}/d/{T.SLURM_JOB_DASHBOARD_UID}/?var-cluster={{{{ $labels.cluster | urlquery }}}}"
        f"&var-job_id={{{{ $labels.job_id | urlquery }}}}&viewPanel={panel_id}"
    )


def on_the_ranks_node(condition: str) -> str:
    """A rank alert's condition, labelled with the instance (and node) of the agent on the rank's
    host where that is known, else of the agent that exports the rank (on a shared filesystem,
    maybe another node's): Alertmanager inhibits a straggler by its node's own alerts."""
    return (
        f"(\n{condition}\n)\n* on (cluster, host) group_left (instance, node) {HOST_INFO}\n"
        f"or on (cluster, job_id, rank)\n(\n{condition}\n)"
    )


RANK_ANNOTATIONS = (("suspects", RANK_SUSPECTS), ("dashboard_url", _dashboard_url(T.RANK_SUSPECTS_PANEL_ID)))
GPU_ANNOTATIONS = (("suspects", GPU_SUSPECTS), ("dashboard_url", _dashboard_url(T.GPU_DEVIATION_PANEL_ID)))
WORK_30M = f"job_rank:{WORK}:mean{W}"
GPU_30M = f"job_gpu:lockstep_gpu_sm_clock_hertz:avg{W}"


def _quoted(value: str) -> str:
    """A PromQL string literal (Go's escapes, which JSON's are for these characters)."""
    return json.dumps(value)


def above_ttft_slo(default: float, by_model: dict[str, float]) -> str:
    """The p95 time to first token where it is above its SLO: the model's own SLO for the models
    listed in by_model (thresholds.py INFERENCE_TTFT_SLO_SECONDS_BY_MODEL), the default for the rest."""
    others = ", ".join(f"model!={_quoted(model)}" for model in by_model)
    clauses = [f"{TTFT_P95}{{{others}}} > {num(default)}" if others else f"{TTFT_P95} > {num(default)}"]
    clauses += [f"{TTFT_P95}{{model={_quoted(model)}}} > {num(slo)}" for model, slo in by_model.items()]
    return "\nor\n".join(clauses)


def ttft_slo_text(default: float, by_model: dict[str, float]) -> str:
    """The alerted model's SLO in seconds, as a Go template."""
    text = ""
    for model, slo in by_model.items():
        text += f"{{{{ {'else ' if text else ''}if eq $labels.model {_quoted(model)} }}}}{num(slo)}"
    return f"{text}{{{{ else }}}}{num(default)}{{{{ end }}}}" if text else num(default)


WORKLOAD_ALERTS = Group(
    "lockstep-workloads.alerts",
    (
        Alert(
            "LockstepTrainingStraggler",
            "warning",
            "10m",
            on_the_ranks_node(
                "job_rank:lockstep_training_compute_seconds:ratio_to_median5m"
                f" > {num(T.TRAINING_STRAGGLER_COMPUTE_RATIO)}\n"
                f"and {JOB_ON} job:lockstep_training_ranks:count >= {T.STRAGGLER_MIN_PEERS}"
            ),
            f"Rank {label('rank')} of job {label('job_id')} is a straggler",
            f"Rank {label('rank')} of job {label('job_id')} on {WHERE} takes {VALUE_2F}x its job's median compute "
            "time per step (5 min average). Its peers wait for it in communication, so the whole job runs at "
            "its pace. Suspects on its node in the last 30 minutes: " + RANK_SUSPECTS + ".",
            RANK_ANNOTATIONS,
        ),
        Alert(
            "LockstepTrainingStragglerSustained",
            "warning",
            T.STRAGGLER_SUSTAINED_FOR,
            on_the_ranks_node(
                "(\n"
                f"  job_rank:{WORK}:ratio_to_median{W} > {num(T.TRAINING_STRAGGLER_SUSTAINED_RATIO)}\n"
                f"  and\n  job_rank:{WORK}:ratio_to_median5m > {num(T.TRAINING_STRAGGLER_SUSTAINED_NOW_RATIO)}\n"
                f"  and\n  {WORK_30M} - {JOB_ON} group_left () job:{WORK}:median{W}\n"
                f"  > {JOB_ON} group_left ()\n  {num(T.STRAGGLER_SUSTAINED_MADS)} * job:{WORK}:mad{W}\n)\n"
                f"and {JOB_ON} job:lockstep_training_ranks:count >= {T.STRAGGLER_SUSTAINED_MIN_PEERS}"
            ),
            f"Rank {label('rank')} of job {label('job_id')} has been slower than its peers for 30 minutes",
            f"Rank {label('rank')} of job {label('job_id')} (host {label('host')}) has taken {VALUE_2F}x its job's "
            "median time per step of its own work (compute and data wait) over 30 minutes, more than "
            f"{percent(T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1)} and {num(T.STRAGGLER_SUSTAINED_MADS)} times the "
            "job's spread (MAD) above the median, and is still slower now. The whole job runs at its pace. "
            "Suspects on its node in the last 30 minutes: " + RANK_SUSPECTS + ".",
            RANK_ANNOTATIONS,
        ),
        Alert(
            "LockstepGPUStraggler",
            "warning",
            "10m",
            f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m < {num(T.GPU_STRAGGLER_SM_CLOCK_RATIO)}\n"
            f"and {JOB_ON} job:lockstep_gpus_busy:count >= {T.STRAGGLER_MIN_PEERS}",
            f"GPU {label('gpu')} on {WHERE} is slower than the rest of job {label('job_id')}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} runs its SM clock at {VALUE_PERCENT} of the median "
            f"of job {label('job_id')}'s busy GPUs (5 min average). A synchronous job runs at its slowest GPU's "
            "pace. Suspects in the last 30 minutes: " + GPU_SUSPECTS + ".",
            GPU_ANNOTATIONS,
        ),
        Alert(
            "LockstepGPUStragglerSustained",
            "warning",
            T.STRAGGLER_SUSTAINED_FOR,
            "(\n"
            # In percent, so the description's rounded value does not flicker in its last digit.
            f"  100 * job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median{W}"
            f" < {num(100 * T.GPU_STRAGGLER_SUSTAINED_RATIO)}\n"
            "  and\n  job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m"
            f" < {num(T.GPU_STRAGGLER_SUSTAINED_NOW_RATIO)}\n"
            f"  and\n  job:lockstep_gpu_sm_clock_hertz:median{W} - {JOB_ON} group_right () {GPU_30M}\n"
            f"  > {JOB_ON} group_left ()\n"
            f"  {num(T.STRAGGLER_SUSTAINED_MADS)} * job:lockstep_gpu_sm_clock_hertz:mad{W}\n)\n"
            f"and {JOB_ON} job:lockstep_gpus_busy:count >= {T.STRAGGLER_SUSTAINED_MIN_PEERS}",
            f"GPU {label('gpu')} on {WHERE} has been slower than the rest of job {label('job_id')} for 30 minutes",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} has run its SM clock at "
            '{{ printf "%.0f" $value }} % of the '
            f"median of job {label('job_id')}'s busy GPUs over 30 minutes, more than "
            f"{percent(1 - T.GPU_STRAGGLER_SUSTAINED_RATIO)} and {num(T.STRAGGLER_SUSTAINED_MADS)} times the job's "
            "spread (MAD) below the median, and is still slower now. Suspects in the last 30 minutes: "
            + GPU_SUSPECTS
            + ".",
            GPU_ANNOTATIONS,
        ),
        Alert(
            "LockstepTrainingStalled",
            "critical",
            "5m",
            # The last step's time, not rate(steps): the agent drops a rank that logged nothing
            # for its idle_timeout, so a hung job's series vanish just when "no step in 10
            # minutes" becomes true.  last_over_time keeps the last value seen; changes() over
            # the window tells whether a step came in it.  A hung job and a finished one both
            # stop logging: Slurm still running the job tells them apart.  A job that logged
            # its first step less than the window ago has had no change in the window yet
            # either: only a job seen stepping before the window (offset) can have stopped.
            f"time() - max {job_by()} (\n"
            f"  last_over_time(lockstep_training_last_step_timestamp_seconds[{T.TRAINING_STALL_LOOKBACK}])\n"
            ")\n"
            f"unless {JOB_ON} max {job_by()} (\n"
            f"  changes(lockstep_training_last_step_timestamp_seconds[{T.TRAINING_STALL_WINDOW}])\n"
            ") > 0\n"
            f"and {JOB_ON} group {job_by()} (\n"
            "  last_over_time(lockstep_training_last_step_timestamp_seconds"
            f"[{T.TRAINING_STALL_LOOKBACK}] offset {T.TRAINING_STALL_WINDOW})\n"
            ")\n"
            f"and {JOB_ON} group {job_by()} (lockstep_slurm_job_info)",
            f"Training job {label('job_id')} makes no progress",
            f"No rank of job {label('job_id')} completed a training step for {VALUE_DURATION}, and Slurm still "
            "runs the job. A hung collective (NCCL), a dead rank, a lost GPU or a stalled filesystem holds "
            "every rank while the allocation burns.",
        ),
        Alert(
            "LockstepKVCachePressure",
            "warning",
            "5m",
            f"lockstep_inference_kv_cache_usage_ratio > {num(T.KV_CACHE_USAGE_RATIO)}\n"
            "and lockstep_inference_requests_waiting > 0",
            f"KV cache of {label('server')} is full and requests queue",
            f"The {label('engine')} endpoint {label('server')} ({label('model')}) on {WHERE} has used "
            f"{VALUE_PERCENT} of its KV cache for 5 minutes while requests wait for a slot: time to first token "
            "grows with the queue. Add replicas, lower max concurrency or context length, or free GPU memory.",
        ),
        Alert(
            "LockstepKVCachePreemptions",
            "warning",
            "5m",
            f"rate(lockstep_inference_preemptions_total[5m]) * 60 > {num(T.KV_PREEMPTIONS_PER_MINUTE)}",
            f"{label('server')} keeps preempting requests",
            f"The {label('engine')} endpoint {label('server')} ({label('model')}) on {WHERE} preempts "
            f"{VALUE_2F} requests a minute: it runs out of KV cache blocks mid-generation, evicts requests and "
            "recomputes them later, wasting GPU time and inflating their latency.",
        ),
        Alert(
            "LockstepInferenceThroughputDrop",
            "warning",
            "10m",
            f"{TOKENS_RATE}\n"
            f"/ (\n  quantile_over_time({num(T.INFERENCE_THROUGHPUT_BASELINE_QUANTILE)}, "
            f"{TOKENS_RATE}[{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW}])\n  > 0\n)\n"
            f"< {num(T.INFERENCE_THROUGHPUT_DROP_RATIO)}\n"
            "and server:lockstep_inference_requests_waiting:avg5m > 0",
            f"{label('server')} generates far fewer tokens than it did in the last hour",
            f"The {label('engine')} endpoint {label('server')} ({label('model')}) on {WHERE} generates "
            f"{VALUE_PERCENT} of the tokens per second it sustained in the last "
            f"{T.INFERENCE_THROUGHPUT_BASELINE_WINDOW} (5 min rate) while requests wait: it is saturated and "
            "slower than it was, not less busy. A slow or throttled GPU, a stuck worker, preemptions, or a change "
            "of request shapes (longer prompts) or of the engine's settings.",
        ),
        Alert(
            "LockstepInferenceTTFTHigh",
            "warning",
            "10m",
            above_ttft_slo(T.INFERENCE_TTFT_SLO_SECONDS, T.INFERENCE_TTFT_SLO_SECONDS_BY_MODEL),
            f"Time to first token of {label('server')} is above its SLO",
            f"The p95 time to first token of the {label('engine')} endpoint {label('server')} ({label('model')}) "
            f"on {WHERE} is {VALUE_2F} s over 5 minutes, above its SLO of "
            + ttft_slo_text(T.INFERENCE_TTFT_SLO_SECONDS, T.INFERENCE_TTFT_SLO_SECONDS_BY_MODEL)
            + " s, for 10 minutes. Requests wait in its queue (KV cache full, too few replicas) or its prefill "
            "is slow (long prompts, a slow GPU).",
        ),
        Alert(
            "LockstepInferenceErrors",
            "warning",
            "10m",
            f"{FAILED_RATIO} > {num(T.INFERENCE_FAILED_REQUESTS_RATIO)}\n"
            f"and {FINISHED_RATE} * 60 >= {num(T.INFERENCE_MIN_REQUESTS_PER_MINUTE)}",
            f"{label('server')} aborts or fails many requests",
            f"{VALUE_PERCENT} of the requests the {label('engine')} endpoint {label('server')} ({label('model')}) "
            f"on {WHERE} finished in the last 5 minutes were aborted or failed (over "
            f"{percent(T.INFERENCE_FAILED_REQUESTS_RATIO)} for 10 minutes). Aborts are clients or the server "
            "giving up (timeouts while requests queue); errors are the engine failing them. The engine's log "
            "says why.",
        ),
        Alert(
            "LockstepCheckpointStalled",
            "critical",
            "5m",
            f"lockstep_checkpoint_in_progress_seconds\n> {num(T.CHECKPOINT_STALL_INTERVALS)} * {EXPECTED_INTERVAL}",
            f"Checkpoint save under {label('root')} is stalled",
            f"A save under {label('root')} on {WHERE} has been in progress for {VALUE_DURATION}, longer than the "
            "root's save interval, and has not completed: the job may be blocked writing it and everything since "
            "the last completed save is at risk. Check the filesystem and the job's ranks.",
        ),
        Alert(
            "LockstepCheckpointOverdue",
            "warning",
            "5m",
            # The age is computed here, not taken from the recording rule, which lags by an evaluation.
            "(\n  time() - lockstep_checkpoint_last_success_timestamp_seconds\n"
            f"  > {num(T.CHECKPOINT_OVERDUE_INTERVALS)} * {EXPECTED_INTERVAL}\n)\n"
            "unless\n(\n  lockstep_checkpoint_in_progress_seconds\n"
            f"  > {num(T.CHECKPOINT_STALL_INTERVALS)} * {EXPECTED_INTERVAL}\n)",
            f"No checkpoint completed under {label('root')} for too long",
            f"The last completed save under {label('root')} on {WHERE} finished {VALUE_DURATION} ago, more than "
            f"{num(T.CHECKPOINT_OVERDUE_INTERVALS)} save intervals, and no save is stuck in progress (that would be "
            "LockstepCheckpointStalled): saves fail, or the job stopped saving.",
        ),
    ),
)

GPU_COLLECTOR_STUCK = 'lockstep_collector_state{collector="gpu", state="stuck"} == 1'
THERMAL_REASONS = ("hw_thermal_slowdown", "sw_thermal_slowdown")


def throttled_share(reasons: tuple[str, ...]) -> str:
    """The share of the window in which any of the clock event reasons held the GPU down.

    The rate of the cumulative time (lockstep_gpu_clock_event_seconds_total): a GPU hovering at
    its limit flickers in and out of it, so the flag at each evaluation says little.  GPUs that
    do not report that time fall back to the flag (which then has to hold through the 'for')."""
    selector = f'{{reason=~"{regex(reasons)}"}}'
    return (
        f"sum without (reason) (rate(lockstep_gpu_clock_event_seconds_total{selector}[{T.GPU_THROTTLE_WINDOW}]))\n"
        f"  > {num(T.GPU_THROTTLE_TIME_RATIO)}\n"
        f"or\n(\n  max without (reason) (lockstep_gpu_clock_event_active{selector}) == 1\n"
        f"  unless {on('uuid')} group {by('uuid')} (lockstep_gpu_clock_event_seconds_total{selector})\n)"
    )


GPU_ALERTS = Group(
    "lockstep-gpu.alerts",
    (
        Alert(
            "LockstepGPUFellOffBus",
            "critical",
            "1m",
            # On a node running a single Slurm job (the usual exclusive allocation) the alert carries
            # that job's job_id, so Alertmanager can inhibit the job's stall and straggler alerts that
            # the lost GPU causes (alerts/alertmanager.yml).  NVML no longer names the lost GPU's job.
            "(\n  (lockstep_gpu_up == 0)\n"
            f"  * {on()} group_left (job_id)\n"
            f"  (\n    max {by('job_id')} (lockstep_slurm_job_info)\n"
            f"    unless {on()} count {by()} (lockstep_slurm_job_info) > 1\n  )\n"
            f"  or {on('uuid')}\n  lockstep_gpu_up == 0\n)\n"
            # Fewer GPUs than an hour ago, none counting as fewer while the agent is scraped.
            f"or\ncount {by()} (lockstep_gpu_info offset 1h)\n"
            f"  > (count {by()} (lockstep_gpu_info) or {on()} 0 * group {by()} (lockstep_build_info))\n"
            f"  unless {on()} {GPU_COLLECTOR_STUCK}\n"
            "or\n"
            # NVML hangs after GPU faults: the GPU collector is stuck in it and every GPU series
            # of the node ages out.  That is the lost GPU's signal, and it does not vanish.
            f'lockstep_collector_duration_seconds{{collector="gpu"}}\n  and {on()} {GPU_COLLECTOR_STUCK}',
            f"GPU lost on {WHERE}",
            "{{ if $labels.uuid }}GPU " + label("gpu") + " (" + label("uuid") + ") on " + WHERE + " no longer "
            "answers NVML (fallen off the bus, XID 79).{{ else if $labels.collector }}NVML on " + WHERE + " has "
            "not answered for " + VALUE_DURATION + ": the GPU collector is stuck in it. NVML hangs after a GPU "
            "fault (fallen off the bus, XID 79), and every GPU metric of the node is missing while it does."
            "{{ else }}" + WHERE + " reports fewer GPUs than an hour ago: a GPU vanished (e.g. not enumerated "
            "after a reboot, or NVML no longer finds any).{{ end }} Jobs on it have failed or hang"
            "{{ with $labels.job_id }} (Slurm job {{ . }}){{ end }}; drain the node.",
        ),
        Alert(
            "LockstepGPUXidCritical",
            "critical",
            "0m",
            f'increase(lockstep_gpu_xid_errors_total{{xid=~"{regex(T.CRITICAL_XIDS)}"}}[10m]) > 0\nor\n'
            f'(\n  lockstep_gpu_xid_errors_total{{xid=~"{regex(T.CRITICAL_XIDS)}"}}\n'
            f'  unless lockstep_gpu_xid_errors_total{{xid=~"{regex(T.CRITICAL_XIDS)}"}} offset 10m\n)',
            f"GPU {label('gpu')} on {WHERE} reported XID {label('xid')}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} reported critical XID {label('xid')} in the last "
            "10 minutes (48 double-bit ECC, 64 row remap failure, 74 NVLink, 94/95 ECC, 119/120 GSP, ...). "
            "Look the code up in NVIDIA's XID catalogue; most need a GPU reset or a drain.",
        ),
        Alert(
            "LockstepGPUUncorrectableECC",
            "critical",
            "0m",
            'increase(lockstep_gpu_ecc_errors_total{type="uncorrected"}[10m]) > 0',
            f"Uncorrectable ECC errors on GPU {label('gpu')} on {WHERE}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} had uncorrectable (double-bit) memory errors in the "
            "last 10 minutes: the process using the memory got corrupt data or was killed. The GPU needs a reset "
            "to remap the row.",
        ),
        Alert(
            "LockstepGPURowRemapFailure",
            "critical",
            "1m",
            "lockstep_gpu_row_remapping_failed == 1",
            f"GPU {label('gpu')} on {WHERE} has no spare memory rows left",
            f"A row remapping failed on GPU {label('gpu')} ({label('uuid')}) on {WHERE}: its memory has bad rows "
            "it can no longer replace. Drain the node and replace the GPU (RMA).",
        ),
        Alert(
            "LockstepGPUThermalSlowdown",
            "warning",
            "5m",
            throttled_share(THERMAL_REASONS),
            f"GPU {label('gpu')} on {WHERE} is throttled for heat",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} had its clocks held down for heat (thermal slowdown) "
            f"{VALUE_PERCENT} of the last {T.GPU_THROTTLE_WINDOW}, for 5 minutes: it runs slower than its peers and "
            "slows its job. Check cooling (fans, airflow, inlet temperature) and the GPU's temperature.",
        ),
        Alert(
            "LockstepGPUPowerBrake",
            "warning",
            "1m",
            throttled_share(("hw_power_brake",)),
            f"Power brake holds GPU {label('gpu')} on {WHERE} down",
            f"The hardware power brake of GPU {label('gpu')} ({label('uuid')}) on {WHERE} was engaged "
            f"{VALUE_PERCENT} of the last {T.GPU_THROTTLE_WINDOW}: the system signalled a power supply problem and "
            "the GPU runs at minimum clocks. Check the node's power supplies and BMC event log.",
        ),
    ),
)

# The per-link rules in their own group: a node has 18 links per GPU and up to a dozen error
# counters per link (432 series on the simulated H100 node, against 32 GPU-wide).  When
# LockstepNVLinkErrors read every link's counters it took 4.7 s of the GPU group's 6.4 s at 256
# nodes, 66 s at 1,024 (bench/fleet.py, docs/performance.md); it now reads the GPU-wide sums.
# Prometheus evaluates groups side by side, so the per-GPU alerts above (a GPU off the bus,
# XIDs, ECC) do not wait for the per-link ones.
NVLINK_PER_LINK_TYPES = tuple(t for t in T.NVLINK_PER_LINK_ONLY_ERROR_TYPES if t not in T.NVLINK_IGNORED_ERROR_TYPES)
NVLINK_ALERTS = Group(
    "lockstep-nvlink.alerts",
    (
        Alert(
            "LockstepNVLinkDown",
            "critical",
            "5m",
            "lockstep_nvlink_up == 0",
            f"NVLink {label('link')} of GPU {label('gpu')} on {WHERE} is down",
            f"NVLink link {label('link')} of GPU {label('gpu')} ({label('uuid')}) on {WHERE} has been inactive "
            "for 5 minutes: traffic to its peers falls back to fewer links or PCIe and collectives slow down.",
        ),
        Alert(
            "LockstepNVLinkErrors",
            "warning",
            "5m",
            # GPU-wide sums where NVML has them; per link only the types of GPUs without them
            # (a selector over every link's DL counters cost most of the rule groups' time at
            # fleet scale).
            f"sum {by('gpu', 'uuid')} (rate(lockstep_gpu_nvlink_errors_total[10m])) * 60"
            f" > {num(T.NVLINK_ERRORS_PER_MINUTE)}\nor\n(\n"
            f"  sum {by('gpu', 'uuid', 'link')} (\n"
            "    rate(lockstep_nvlink_errors_total"
            f'{{type=~"{regex(NVLINK_PER_LINK_TYPES)}"}}[10m])\n'
            f"  ) * 60 > {num(T.NVLINK_ERRORS_PER_MINUTE)}\n"
            f"  unless {on('uuid')} group {by('uuid')} (lockstep_gpu_nvlink_errors_total)\n)",
            f"NVLink errors on GPU {label('gpu')} on {WHERE}",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} counts {VALUE_2F} NVLink errors a minute"
            "{{ with $labels.link }} on link {{ . }}{{ end }} (replays, recoveries, CRC errors; 10 min average): "
            "a degrading link or NVSwitch port.",
        ),
    ),
)

# A GPU a Slurm job or a pod holds, and whose job (pod) it is: the job's and the pod's GPU info.
HELD_GPUS = "(\n  lockstep_slurm_job_gpu_info\n  or\n  lockstep_k8s_pod_gpu_info\n)"
HOLDER = (
    "{{ with $labels.job_id }}Slurm job {{ . }}{{ else }}pod {{ $labels.k8s_namespace }}/{{ $labels.k8s_pod }}{{ end }}"
)
FABRIC_CONDITIONS = regex(T.GPU_FABRIC_DEGRADED_CONDITIONS)
ACTION = "{{ with $labels.action }}{{ . }}{{ else }}a recovery action this agent does not know{{ end }}"

GPU_VERDICT_ALERTS = Group(
    "lockstep-gpu-verdicts.alerts",
    (
        Alert(
            "LockstepGPUIdleWhileAllocated",
            "warning",
            T.GPU_IDLE_FOR,
            # SM activity where GPM gives it (whole GPUs, not MIG instances), else utilization.
            f"{HELD_GPUS}\n* {on('uuid')} group_left ()\n(\n"
            f'  {SM_ACTIVE}{{gpu_instance_id=""}} < {num(T.GPU_IDLE_ACTIVITY_RATIO)}\n'
            "  or\n"
            f"  (\n    avg_over_time(lockstep_gpu_utilization_ratio[5m]) < {num(T.GPU_IDLE_ACTIVITY_RATIO)}\n"
            f"    unless {on('uuid')} {SM_ACTIVE}\n  )\n)",
            f"GPU {label('gpu')} on {WHERE} is allocated but idle",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE} is held by {HOLDER} but has done almost nothing for "
            f"an hour: its SM activity (or, on GPUs without GPM, its utilization) is {VALUE_PERCENT} (5 min "
            f"average), below {percent(T.GPU_IDLE_ACTIVITY_RATIO)}. Nobody else can use it meanwhile.",
        ),
        Alert(
            "LockstepGPURecoveryActionRequired",
            "critical",
            T.GPU_RECOVERY_ACTION_FOR,
            'lockstep_gpu_recovery_action{action!="none"} == 1\n'
            # A value the agent does not know (a newer driver) sets every state to 0, none included.
            # (Not label_replace'd to action="unknown": VictoriaMetrics then loses the action filter.)
            f"or {on('uuid')}\n"
            "max without (action) (lockstep_gpu_recovery_action) == 0",
            f"GPU {label('gpu')} on {WHERE} needs {ACTION}",
            f"The NVIDIA driver asks for {ACTION} for GPU {label('gpu')} ({label('uuid')}) "
            f"on {WHERE}: the GPU is not usable as it is. gpu_reset: reset it once idle; drain_and_reset or "
            "drain_p2p: drain its jobs, then reset; node_reboot, bus_reset, system_reboot: drain the node and "
            "reboot it (docs/gpu.md).",
        ),
        Alert(
            "LockstepGPUFabricDegraded",
            "critical",
            T.GPU_FABRIC_FOR,
            f'lockstep_gpu_fabric_health{{condition=~"{FABRIC_CONDITIONS}"}} == 1\n'
            'or\nlockstep_gpu_fabric_state{state!="completed"} == 1',
            f"NVSwitch fabric of GPU {label('gpu')} on {WHERE} is degraded",
            f"GPU {label('gpu')} ({label('uuid')}) on {WHERE}: "
            "{{ with $labels.condition }}the NVSwitch fabric reports {{ . }}{{ else }}its NVSwitch fabric "
            "registration has been {{ $labels.state }} for 5 minutes{{ end }}. Its NVLink bandwidth to its "
            "peers is reduced or gone: collectives slow down or fail. Check the fabric manager and the "
            "NVSwitches (nvidia-smi -q, section Fabric).",
        ),
    ),
)

FABRIC_ALERTS = Group(
    "lockstep-fabric.alerts",
    (
        Alert(
            "LockstepIBPortDown",
            "critical",
            "3m",
            # Not active at any moment of the window: a port that flaps is LockstepIBLinkFlapping's.
            f"max_over_time(lockstep_ib_port_state[2m]) < 4\n"
            f"unless {on('device', 'port')} lockstep_ib_port_physical_state == 3",
            f"InfiniBand port {label('device')}/{label('port')} on {WHERE} is down",
            f"Port {label('device')}/{label('port')} on {WHERE} has not been ACTIVE for 5 minutes (logical state "
            f"{VALUE}: 1 down, 2 init, 3 armed) and is not administratively disabled. The node's rail is cut off: "
            "check the cable, the switch port and the subnet manager.",
        ),
        Alert(
            "LockstepIBLinkFlapping",
            "warning",
            "0m",
            f"increase(lockstep_ib_port_link_downed_total[{T.IB_LINK_FLAP_WINDOW}])\n"
            f"+ increase(lockstep_ib_port_link_error_recovery_total[{T.IB_LINK_FLAP_WINDOW}])\n"
            f">= {T.IB_LINK_FLAP_EVENTS}\nor\n"
            'lockstep_ib_port_saturated{counter=~"link_downed|link_error_recovery"} == 1',
            f"InfiniBand link {label('device')}/{label('port')} on {WHERE} flaps",
            f"Port {label('device')}/{label('port')} on {WHERE} went down or retrained "
            f"{{{{ if $labels.counter }}}}so often its {label('counter')} counter saturated"
            f"{{{{ else }}}}{VALUE_2F} times in {T.IB_LINK_FLAP_WINDOW}{{{{ end }}}}. Every flap stalls the "
            "collectives crossing it: reseat or replace the cable or transceiver.",
        ),
        Alert(
            "LockstepIBSymbolErrors",
            "warning",
            "0m",
            f"increase(lockstep_ib_port_symbol_errors_total[1h]) > {T.IB_SYMBOL_ERRORS_PER_HOUR}\nor\n"
            'lockstep_ib_port_saturated{counter="symbol_error"} == 1',
            f"Symbol errors on InfiniBand port {label('device')}/{label('port')} on {WHERE}",
            f"Port {label('device')}/{label('port')} on {WHERE} "
            "{{ if $labels.counter }}has a saturated symbol_error counter (65535: it no longer counts; reset it "
            "with perfquery -R to see new errors){{ else }}counted " + VALUE_2F + " symbol errors in the last "
            "hour{{ end }}: a marginal cable or transceiver, often before the link starts flapping.",
        ),
        Alert(
            "LockstepIBCongestion",
            "warning",
            "15m",
            f"port:lockstep_ib_port_transmit_wait:ratio5m > {num(T.IB_TRANSMIT_WAIT_RATIO)}",
            f"InfiniBand port {label('device')}/{label('port')} on {WHERE} waits for credits",
            f"Port {label('device')}/{label('port')} on {WHERE} spent {VALUE_PERCENT} of its transmit time "
            "waiting for flow-control credits (port_xmit_wait) for 15 minutes: the fabric behind it is congested "
            "(hot spot, slow receiver, or a misrouted or degraded link).",
        ),
        Alert(
            "LockstepPFCStorm",
            "critical",
            "2m",
            f'max {by("interface")} (rate(lockstep_pfc_pause_seconds_total{{direction="tx"}}[5m]))'
            f" > {num(T.PFC_TX_PAUSE_RATIO)}\nor\n"
            f"sum {by('interface')} (increase(lockstep_pfc_pause_storm_events_total[10m])) > 0",
            f"PFC pause storm from {label('interface')} on {WHERE}",
            f"Interface {label('interface')} on {WHERE} keeps pausing its switch port (transmitted pause over "
            f"{percent(T.PFC_TX_PAUSE_RATIO)} of the time, or the NIC's pause-storm detector fired): its receive "
            "path is stalled and the pause spreads through the lossless fabric, stalling other nodes' RoCE traffic.",
        ),
        Alert(
            "LockstepRoCECongestionControlOff",
            "warning",
            "15m",
            f"max {by('interface', 'role')} (lockstep_roce_dcqcn_enabled) == 0\nor\n"
            f"rate(lockstep_roce_cnp_ignored_total[10m]) > {num(T.ROCE_CNP_IGNORED_PER_SECOND)}",
            f"RoCE congestion control is off on {WHERE}",
            "{{ if $labels.interface }}DCQCN "
            + label("role")
            + " is disabled on every priority of "
            + label("interface")
            + "{{ else }}"
            + label("device")
            + "/"
            + label("port")
            + " ignores "
            + VALUE_2F
            + " congestion notifications a second{{ end }} on "
            + WHERE
            + ": senders do not slow down when the fabric marks congestion, so it turns into PFC pause "
            "and drops instead.",
        ),
    ),
)


def almost_full(local: bool) -> str:
    """Local (shared=False) or shared filesystems with < 5 % available, or < 15 % and full within a
    day at the last 6 hours' rate; read-only mounts left out (nothing writes to them)."""
    fstype = f'{{fstype{"!~" if local else "=~"}"{T.SHARED_FSTYPES}"}}'
    ratio = f"mountpoint:lockstep_filesystem_available_bytes:ratio{fstype}"
    return (
        f"(\n  {ratio} < {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)}\n  or\n  (\n"
        f"    {ratio} < {num(T.FILESYSTEM_AVAILABLE_PREDICT_RATIO)}\n"
        f"    and predict_linear(lockstep_filesystem_available_bytes{fstype}[{T.FILESYSTEM_PREDICT_WINDOW}], "
        f"{T.FILESYSTEM_PREDICT_HORIZON_SECONDS}) < 0\n  )\n)\n"
        f"unless {on('mountpoint')} lockstep_filesystem_readonly == 1"
    )


def below_maximum(current: str, maximum: str, dimension: str, selector: str = "", indent: str = "") -> str:
    """Links whose current width or generation is below their maximum, with degraded="<dimension>"
    so that a link below both is two alerts, each saying what it lost."""
    lines = ("label_replace(", f"  {current}{selector} < {maximum},", f'  "degraded", "{dimension}", "", ""', ")")
    return "\n".join(indent + line for line in lines)


HCA_KINDS = f'{{kind=~"{regex(T.PCIE_ALERT_KINDS)}"}}'
PCIE_ALERTS = Group(
    "lockstep-pcie.alerts",
    (
        Alert(
            "LockstepPCIeLinkDegraded",
            "warning",
            T.PCIE_DEGRADED_FOR,
            # GPUs only while busy: an idle GPU lowers its link generation (and may lower its width)
            # to save power, which is no fault (thresholds.py).
            "(\n  (\n"
            + below_maximum(
                "lockstep_gpu_pcie_link_width_lanes", "lockstep_gpu_pcie_link_max_width_lanes", "width", indent="    "
            )
            + "\n  or\n"
            + below_maximum(
                "lockstep_gpu_pcie_link_generation",
                "lockstep_gpu_pcie_link_max_generation",
                "generation",
                indent="    ",
            )
            + f"\n  )\n  and {on('uuid')}\n"
            + f"  lockstep_gpu_utilization_ratio >= {num(T.PCIE_GPU_BUSY_UTILIZATION)}\n)\nor\n"
            + below_maximum("lockstep_pcie_link_width_lanes", "lockstep_pcie_link_max_width_lanes", "width", HCA_KINDS)
            + "\nor\n"
            + below_maximum(
                "lockstep_pcie_link_generation", "lockstep_pcie_link_max_generation", "generation", HCA_KINDS
            ),
            "PCIe link of {{ if $labels.uuid }}GPU "
            + label("gpu")
            + "{{ else }}"
            + label("device")
            + "{{ end }} on "
            + WHERE
            + " runs below its maximum "
            + label("degraded"),
            "{{ if $labels.uuid }}GPU "
            + label("gpu")
            + " ("
            + label("uuid")
            + "){{ else }}"
            + label("kind")
            + " device "
            + label("device")
            + "{{ end }} on "
            + WHERE
            + " has run its PCIe link at "
            '{{ if eq $labels.degraded "width" }}x{{ $value }}{{ else }}Gen{{ $value }}{{ end }}, below the '
            "most it and its slot can do, for " + T.PCIE_DEGRADED_FOR + "{{ if $labels.uuid }} while busy{{ end }}: "
            "it trained down (x8 instead of x16, or one generation down, halves the bandwidth), so its "
            "{{ if $labels.uuid }}host-to-device copies{{ else }}GPUDirect RDMA and host traffic{{ end }} slow its job "
            "down. Check the slot, riser and cable; reseat, or reset the device to retrain the link.",
        ),
    ),
)

STORAGE_ALERTS = Group(
    "lockstep-storage.alerts",
    (
        Alert(
            "LockstepFilesystemHung",
            "critical",
            "1m",
            f"lockstep_filesystem_responsive == 0\nor {on('mountpoint')}\n"
            f"sum {by('mountpoint')} (rate(lockstep_nfs_major_timeouts_total[5m])) > 0",
            f"Filesystem {label('mountpoint')} on {WHERE} does not answer",
            f"{label('mountpoint')} on {WHERE} does not answer: statfs on it did not return within the agent's "
            "deadline, or its NFS requests time out (server not responding). Processes touching it hang in D "
            "state; check the server and the network path to it.",
        ),
        Alert(
            "LockstepFilesystemAlmostFull",
            "warning",
            "30m",
            f"{almost_full(local=True)}\nor\n"
            # A shared filesystem is one alert per cluster, not one per node that mounts it:
            # the fullest node's view, among those that mount it writable.
            f"min by (cluster, mountpoint, fstype) (\n{almost_full(local=False)}\n)",
            f"Filesystem {label('mountpoint')} is almost full",
            f"{label('mountpoint')} ({label('fstype')}){{{{ with $labels.instance }}}} on {WHERE}{{{{ end }}}} "
            f"has {VALUE_PERCENT} of its space left"
            f"{{{{ if lt $value {num(T.FILESYSTEM_AVAILABLE_CRITICAL_RATIO)} }}}}{{{{ else }}}} and fills up within "
            "a day at the rate of the last 6 hours{{ end }}. Checkpoint saves and logs fail when it is full.",
        ),
        Alert(
            "LockstepIOStall",
            "warning",
            "10m",
            f"instance:lockstep_host_io_full_pressure:ratio5m > {num(T.IO_FULL_PRESSURE_RATIO)}",
            f"I/O stalls every task on {WHERE}",
            f"For {VALUE_PERCENT} of the time (5 min average) every non-idle task on {WHERE} waited for I/O "
            "(pressure stall information, io full). Training stalls on data loading or checkpoint writes: "
            "check the filesystems' latency and blocked processes.",
        ),
    ),
)

AGENT_ALERTS = Group(
    "lockstep-agent.alerts",
    (
        Alert(
            "LockstepCollectorFailing",
            "warning",
            "10m",
            # A GPU collector stuck in NVML is LockstepGPUFellOffBus's (critical, within minutes).
            f"lockstep_collector_up == 0\nunless {on('collector')} {GPU_COLLECTOR_STUCK}",
            f"Collector {label('collector')} on {WHERE} is failing",
            f"The {label('collector')} collector of the agent on {WHERE} has failed or been stuck past its deadline "
            "for 10 minutes: its metrics are missing, and the alerts built on them cannot fire. "
            "`lockstep doctor` and the agent's log say why.",
        ),
        Alert(
            "LockstepAgentDown",
            "critical",
            "5m",
            f'up{{job="{T.AGENT_JOB}"}} == 0\nor\nabsent(up{{job="{T.AGENT_JOB}"}})',
            "{{ if $labels.instance }}Lockstep agent on " + WHERE + " is down{{ else }}No Lockstep agent is scraped"
            "{{ end }}",
            "{{ if $labels.instance }}Prometheus cannot scrape the Lockstep agent on " + WHERE + "{{ else }}"
            f'Prometheus has no target in scrape job "{T.AGENT_JOB}" at all{{{{ end }}}}: no other Lockstep '
            "alert can fire for a node whose agent is not scraped. Check the agent's service "
            "(systemctl status lockstep, or the "
            "DaemonSet's pod) and the network path from Prometheus.",
        ),
    ),
)

ALERT_GROUPS = (
    WORKLOAD_ALERTS,
    GPU_ALERTS,
    GPU_VERDICT_ALERTS,
    NVLINK_ALERTS,
    FABRIC_ALERTS,
    PCIE_ALERTS,
    STORAGE_ALERTS,
    AGENT_ALERTS,
)


def alerts() -> list[Alert]:
    return [rule for group in ALERT_GROUPS for rule in group.rules if isinstance(rule, Alert)]


def recordings() -> list[Recording]:
    return [rule for group in RECORDING_GROUPS for rule in group.rules if isinstance(rule, Recording)]


# --- Rendering -----------------------------------------------------------------------------------

HEADER = (
    "# Generated by `python -m alerts --write` from alerts/rules.py and alerts/thresholds.py:\n"
    "# do not edit by hand (tests/test_alert_rules.py fails when this file is out of date).\n"
)
_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


_RANGE = re.compile(r"\[(\d+[smhd])\]|offset (\d+[smhd])")


def scale_duration(duration: str, factor: float, minimum: int = 1) -> str:
    """A Prometheus duration times factor, in whole seconds (at least minimum unless it was 0)."""
    match = _DURATION.match(duration)
    if not match:
        raise ValueError(f"not a simple Prometheus duration: {duration!r}")
    seconds = int(match.group(1)) * _SECONDS[match.group(2)]
    if seconds == 0:
        return "0s"
    return f"{max(minimum, round(seconds * factor))}s"


@dataclass(frozen=True)
class Compression:
    """Test-only changes for running the rules against a demo for a minute or two
    (tests/test_alerts_e2e.py); production renders without any.

    for_scale: every `for:` times this, at most max_for seconds.  range_scale, min_range: every range window ([5m]) and
    offset times range_scale, at least min_range seconds: rate() divides by the whole window, so a
    window longer than the data reads low.  clock_offset: time() reads this many seconds earlier
    (the simulated node's wall clock runs behind the real one)."""

    for_scale: float = 1.0
    max_for: int | None = None  # seconds: no compressed 'for' longer than this
    range_scale: float = 1.0
    min_range: int = 1
    clock_offset: float = 0.0

    def expr(self, expr: str) -> str:
        if self.range_scale != 1.0:

            def scaled(match: re.Match[str]) -> str:
                if match.group(1):
                    return f"[{scale_duration(match.group(1), self.range_scale, self.min_range)}]"
                return f"offset {scale_duration(match.group(2), self.range_scale, self.min_range)}"

            expr = _RANGE.sub(scaled, expr)
        if self.clock_offset:
            expr = expr.replace("time()", f"(time() - {self.clock_offset:.0f})")
        return expr

    def for_(self, duration: str) -> str:
        if self.for_scale == 1.0:
            return duration
        scaled = scale_duration(duration, self.for_scale)
        if self.max_for is not None and int(scaled.removesuffix("s")) > self.max_for:
            return f"{self.max_for}s"
        return scaled


PRODUCTION = Compression()


def rule_dict(rule: Recording | Alert, compression: Compression = PRODUCTION) -> dict[str, object]:
    expr = compression.expr(rule.expr)
    if isinstance(rule, Recording):
        return {"record": rule.record, "expr": expr, **({"labels": dict(rule.labels)} if rule.labels else {})}
    return {
        "alert": rule.name,
        "expr": expr,
        "for": compression.for_(rule.for_),
        "labels": {"severity": rule.severity},
        "annotations": {
            "summary": rule.summary,
            "description": rule.description,
            "runbook_url": f"{T.RUNBOOK_BASE_URL}#{rule.runbook_anchor}",
            **dict(rule.annotations),
        },
    }


def groups_dict(groups: tuple[Group, ...], compression: Compression = PRODUCTION) -> list[dict[str, object]]:
    return [{"name": group.name, "rules": [rule_dict(rule, compression) for rule in group.rules]} for group in groups]


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (PromQL over several lines reads as written)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under their key, as yamllint (and most hand-written YAML) wants.
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(data: object) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True)


def render_rule_files(compression: Compression = PRODUCTION) -> dict[str, str]:
    """Rule file path (relative to the repository) -> content."""
    return {
        RULE_FILES["recording"]: HEADER + dump({"groups": groups_dict(RECORDING_GROUPS, compression)}),
        RULE_FILES["alerting"]: HEADER + dump({"groups": groups_dict(ALERT_GROUPS, compression)}),
    }


def render_prometheus_rule() -> str:
    """The same groups as a Prometheus Operator PrometheusRule, for deploy/."""
    resource = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "lockstep",
            "namespace": "lockstep",
            "labels": {"app.kubernetes.io/name": "lockstep"},
        },
        "spec": {"groups": groups_dict(RECORDING_GROUPS) + groups_dict(ALERT_GROUPS)},
    }
    return (
        "---\n"
        + HEADER
        + "# For the Prometheus Operator.  If your Prometheus selects rules by label (ruleSelector, e.g.\n"
        "# release: kube-prometheus-stack), add that label here.\n"
        "# yamllint disable rule:line-length\n" + dump(resource)
    )


def render_all() -> dict[str, str]:
    return {**render_rule_files(), PROMETHEUS_RULE: render_prometheus_rule()}
