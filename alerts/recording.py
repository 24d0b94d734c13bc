"""Recording rules per area: training step times, GPU activity and clocks, inference endpoints,
storage and checkpoints, the fabric, and the fleet dashboard's aggregates.  The sustained
straggler rules, with their suspects, are in alerts/straggler_recording.py.

Recording rules are named level:metric:operations: the level is what a series is per (job_rank,
job_gpu, job, server, root, port, interface, mountpoint, instance), the metric what it
measures, the operations how it was made (mean5m: a per-step mean over 5 minutes from two
counters' rates; ratio_to_median5m: divided by the job's median).
"""

from __future__ import annotations

from alerts.model import Group, Recording
from alerts.promql import JOB_ON, by, job_by, num, on
from lockstep import thresholds as T


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
        # Only where the engine counts its requests that ended well too (any reason but abort and
        # error: vLLM's stop, length, repetition; TGI's, Triton's and Dynamo's success): SGLang
        # counts only its aborts, whose share of themselves would always be 1.
        Recording(
            FAILED_RATIO,
            "(\n"
            "  sum without (reason) (\n"
            f'    rate(lockstep_inference_requests_finished_total{{reason=~"{FAILED_REASONS}"}}[5m])\n  )\n'
            f"  or 0 * {FINISHED_RATE}\n)\n"
            f"/ ({FINISHED_RATE} > 0)\n"
            f'and group without (reason) (lockstep_inference_requests_finished_total{{reason!~"{FAILED_REASONS}"}})',
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

EXPECTED_INTERVAL = "root:lockstep_checkpoint_expected_interval_seconds:or_default"

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
