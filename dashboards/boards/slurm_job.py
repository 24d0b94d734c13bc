"""The Slurm job dashboard: one job's nodes and GPUs, its ranks' step times against each other, its
checkpoints and the fabric ports of its nodes."""

from __future__ import annotations

from alerts.promql import num
from alerts.recording import SM_ACTIVE, TENSOR_ACTIVE
from dashboards.board import Board
from dashboards.boards import nccl
from dashboards.panels import (
    HW_REASONS,
    JOB,
    NONE_BAD,
    ORANGE,
    RATE,
    RED,
    Cell,
    above,
    below,
    stat,
    table,
    timeseries,
    with_id,
)
from dashboards.variables import CLUSTER, JOB_ID
from lockstep import thresholds as T

# Joins that keep a series to the job's GPUs (labelled with the job) or to its nodes.
ON_JOB_GPUS = f"* on (cluster, instance, uuid) group_left (job_id) lockstep_slurm_job_gpu_info{{{JOB}}}"
ON_JOB_NODES = f"* on (cluster, instance) group_left () group by (cluster, instance) (lockstep_slurm_job_info{{{JOB}}})"


def job_summary() -> list[Cell]:
    """The job, its size and pace, its throttled and slowest GPUs."""
    return [
        table(
            "Job",
            [(f"lockstep_slurm_job_info{{{JOB}}}", "")],
            "none",
            hide=("Time", "__name__", "job", "Value"),
            width=24,
            height=5,
        ),
        stat("Nodes", f"count(lockstep_slurm_job_info{{{JOB}}})", "none"),
        stat("GPUs", f"count(lockstep_slurm_job_gpu_info{{{JOB}}})", "none"),
        stat("Ranks", f"sum(job:lockstep_training_ranks:count{{{JOB}}})", "none"),
        stat("Steps per second", f"sum(job:lockstep_training_steps:rate5m{{{JOB}}})", "short"),
        stat(
            "GPUs throttled in hardware",
            f'sum(lockstep_gpu_clock_event_active{{reason=~"{HW_REASONS}"}} {ON_JOB_GPUS})',
            "none",
            thresholds=NONE_BAD,
        ),
        stat(
            "Slowest GPU against the job",
            f"min(job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{JOB}}})",
            "percentunit",
            f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%}.",
            below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
        ),
    ]


def rank_stragglers() -> list[Cell]:
    """Each rank against the job's median, now and over 30 minutes, and the slow ranks' suspects."""
    return [
        timeseries(
            "Compute time per step against the job's median",
            [(f"job_rank:lockstep_training_compute_seconds:ratio_to_median5m{{{JOB}}}", "rank {{rank}}")],
            "suffix:x",
            "Each rank's compute time per step over the job's median rank's (5 min). Wall step time is the same "
            "for every rank of a synchronous job; compute time singles out the straggler. "
            f"LockstepTrainingStraggler fires above {T.TRAINING_STRAGGLER_COMPUTE_RATIO}x for 10 minutes.",
            above((T.TRAINING_STRAGGLER_COMPUTE_RATIO, RED)),
        ),
        with_id(
            T.RANK_DEVIATION_PANEL_ID,
            timeseries(
                "Each rank against the job's median (30 min)",
                [
                    (
                        f"job_rank:lockstep_training_work_seconds:ratio_to_median30m{{{JOB}}} - 1",
                        "rank {{rank}} ({{host}})",
                    )
                ],
                "percentunit",
                "How much longer (or shorter) than the job's median rank each rank takes per step of its own work "
                "(compute and data wait, not waiting for peers), averaged over 30 minutes. Healthy ranks stay "
                "within a few percent. LockstepTrainingStragglerSustained fires for a rank above "
                f"{T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1:.0%} that is also {num(T.STRAGGLER_SUSTAINED_MADS)} "
                "times the job's spread (MAD) above the median, for 10 minutes; its suspects are in the table "
                "beside this panel.",
                above((T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1, RED)),
                width=16,
            ),
        ),
        with_id(
            T.RANK_SUSPECTS_PANEL_ID,
            table(
                "Slow ranks and their suspects",
                [
                    (
                        f"job_rank:lockstep_training_suspect:active30m{{{JOB}}}\nor\nlabel_replace(\n"
                        f"  job_rank:lockstep_training_work_seconds:ratio_to_median30m{{{JOB}}}"
                        f" > {num(T.TRAINING_STRAGGLER_SUSTAINED_RATIO)}\n"
                        "  unless on (cluster, job_id, rank) job_rank:lockstep_training_suspect:active30m,\n"
                        '  "suspect", "none found", "", ""\n)',
                        "",
                    )
                ],
                "none",
                "Ranks more than "
                f"{T.TRAINING_STRAGGLER_SUSTAINED_RATIO - 1:.0%} slower than the job's median (30 min), each with "
                "what its node (host) showed in the same 30 minutes: gpu_throttle (a GPU of this job on it held "
                "down by a thermal, hardware slowdown or power brake clock event), ib_errors, ib_congestion, "
                "pfc_pause, hung_mount, cpu_pressure, io_pressure; data_wait: the rank's own data wait explains "
                "most of its excess. docs/alerting.md says how each is decided.",
                hide=("Time", "__name__", "job", "Value", "instance", "cluster", "job_id"),
                width=8,
            ),
        ),
    ]


def gpu_stragglers() -> list[Cell]:
    """Each GPU's SM clock against the job's median over 30 minutes, beside its slowdown reasons."""
    return [
        with_id(
            T.GPU_DEVIATION_PANEL_ID,
            timeseries(
                "Each GPU's SM clock against the job's median (30 min)",
                [
                    (
                        f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median30m{{{JOB}}} - 1",
                        "{{instance}} GPU {{gpu}}",
                    ),
                    (
                        f"gpu:lockstep_gpu_clock_event_active:avg30m {ON_JOB_GPUS}",
                        "{{instance}} GPU {{gpu}} {{reason}} (share of the time)",
                    ),
                ],
                "percentunit",
                "Each busy GPU's SM clock over the median of the job's busy GPUs, minus 1 (30 min), and beside "
                "it the share of the time a slowdown clock event reason held the GPU down. "
                "LockstepGPUStragglerSustained fires below "
                f"-{1 - T.GPU_STRAGGLER_SUSTAINED_RATIO:.0%} (and {num(T.STRAGGLER_SUSTAINED_MADS)} MADs) for "
                "10 minutes.",
                below(T.GPU_STRAGGLER_SUSTAINED_RATIO - 1),
                width=24,
            ),
        ),
    ]


def step_times() -> list[Cell]:
    """Step, compute and wait times per rank."""
    return [
        timeseries(
            "Step time per rank",
            [
                (f"job_rank:lockstep_training_step_seconds:mean5m{{{JOB}}}", "rank {{rank}} wall"),
                (f"job_rank:lockstep_training_compute_seconds:mean5m{{{JOB}}}", "rank {{rank}} compute"),
            ],
            "s",
        ),
        timeseries(
            "Waiting per step: communication and data",
            [
                (f"job_rank:lockstep_training_comm_wait_seconds:mean5m{{{JOB}}}", "rank {{rank}} communication"),
                (f"job_rank:lockstep_training_data_wait_seconds:mean5m{{{JOB}}}", "rank {{rank}} data"),
            ],
            "s",
            "A straggler's peers wait for it in communication; a rank waiting on data points at the loader or storage.",
        ),
    ]


def framework() -> list[Cell]:
    """The job's own step reports (the framework_logs collector: Megatron-LM, NeMo, torchtitan)."""
    return [
        timeseries(
            "Time per iteration by the framework's own timing",
            [
                (
                    f"rate(lockstep_framework_iteration_seconds_total{{{JOB}}}[{RATE}])"
                    f" / rate(lockstep_framework_iterations_total{{{JOB}}}[{RATE}])",
                    "{{framework}} ({{instance}})",
                ),
                (
                    f"lockstep_framework_straggler_iteration_seconds{{{JOB}}}",
                    "{{framework}} {{extreme}} rank (--log-straggler)",
                ),
            ],
            "s",
            "From the job's output (Slurm StdOut, a container's log): the framework's own time per iteration, "
            "and with Megatron's --log-straggler its fastest and slowest rank's.",
        ),
        timeseries(
            "Since the job's last step report",
            [
                (
                    "time() - max by (job_id, framework) "
                    f"(lockstep_framework_last_iteration_timestamp_seconds{{{JOB}}})",
                    "{{framework}}",
                ),
                (
                    f"increase(lockstep_framework_checkpoint_save_seconds_total{{{JOB}}}[{RATE}])",
                    "{{framework}} checkpoint saving ({{instance}})",
                ),
            ],
            "s",
            "Seconds since the framework last printed a step report; a stall grows without bound. "
            "Saves: the seconds of checkpoint saving the framework reported in the window.",
        ),
    ]


def gpus() -> list[Cell]:
    """The job's GPUs: clock against the median, utilization, activity, DRAM bandwidth, power."""
    return [
        timeseries(
            "SM clock against the job's median",
            [(f"job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{JOB}}}", "{{instance}} GPU {{gpu}}")],
            "percentunit",
            f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%} for 10 minutes.",
            below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
        ),
        timeseries(
            "GPU utilization",
            [(f"lockstep_gpu_utilization_ratio {ON_JOB_GPUS}", "{{instance}} GPU {{gpu}}")],
            "percentunit",
        ),
        timeseries(
            "SM activity of the job's GPUs",
            [
                (f'{SM_ACTIVE}{{gpu_instance_id=""}} {ON_JOB_GPUS}', "{{instance}} GPU {{gpu}}"),
                (f'avg({SM_ACTIVE}{{gpu_instance_id=""}} {ON_JOB_GPUS})', "job average"),
            ],
            "percentunit",
            "Share of SM cycles with a warp on the SM (GPM, Hopper and newer; 5 min). Unlike utilization, it "
            "shows how much of each GPU the job uses. LockstepGPUIdleWhileAllocated fires below "
            f"{T.GPU_IDLE_ACTIVITY_RATIO:.0%} for {T.GPU_IDLE_FOR}.",
            below(T.GPU_IDLE_ACTIVITY_RATIO, bad=ORANGE),
        ),
        timeseries(
            "Tensor activity of the job's GPUs",
            [
                (f'{TENSOR_ACTIVE}{{gpu_instance_id=""}} {ON_JOB_GPUS}', "{{instance}} GPU {{gpu}}"),
                (f'avg({TENSOR_ACTIVE}{{gpu_instance_id=""}} {ON_JOB_GPUS})', "job average"),
            ],
            "percentunit",
            "Share of SM cycles in which the tensor cores were busy (GPM; 5 min): a model's efficiency, "
            "watched for slow regressions.",
        ),
        timeseries(
            "DRAM bandwidth of the job's GPUs",
            [
                (
                    f'lockstep_gpu_dram_bandwidth_used_ratio{{gpu_instance_id=""}} {ON_JOB_GPUS}',
                    "{{instance}} GPU {{gpu}}",
                )
            ],
            "percentunit",
            "Device memory bandwidth used against its maximum, averaged over the collector's interval (GPM): "
            "high with low tensor activity means memory-bound.",
        ),
        timeseries(
            "GPU power",
            [(f"lockstep_gpu_power_watts {ON_JOB_GPUS}", "{{instance}} GPU {{gpu}}")],
            "watt",
        ),
    ]


def checkpoints() -> list[Cell]:
    """Checkpoint roots whose path names the job."""
    return [
        timeseries(
            "Checkpoint: time since the last completed save",
            [
                (
                    "root:lockstep_checkpoint_last_success_timestamp_seconds:age"
                    f" * on (cluster, instance, root) group_left (job_id) lockstep_checkpoint_info{{{JOB}}}",
                    "{{instance}} {{root}}",
                ),
                (
                    "lockstep_checkpoint_in_progress_seconds"
                    f" * on (cluster, instance, root) group_left (job_id) lockstep_checkpoint_info{{{JOB}}}",
                    "{{instance}} {{root}} save in progress",
                ),
            ],
            "s",
            "Checkpoint roots whose path names the job (job=<id>).",
        ),
    ]


def fabric() -> list[Cell]:
    """The fabric ports of the job's nodes: traffic, flaps, PFC pause."""
    return [
        timeseries(
            "Fabric ports of the job's nodes: transmit",
            [(f"rate(lockstep_ib_port_transmitted_bytes_total[{RATE}]) {ON_JOB_NODES}", "{{instance}} {{device}}")],
            "Bps",
        ),
        timeseries(
            f"Fabric ports of the job's nodes: link downs and retrains ({T.IB_LINK_FLAP_WINDOW})",
            [
                (
                    f"(increase(lockstep_ib_port_link_downed_total[{T.IB_LINK_FLAP_WINDOW}])"
                    f" + increase(lockstep_ib_port_link_error_recovery_total[{T.IB_LINK_FLAP_WINDOW}]))"
                    f" {ON_JOB_NODES}",
                    "{{instance}} {{device}}",
                )
            ],
            "short",
            thresholds=above((T.IB_LINK_FLAP_EVENTS, RED)),
        ),
        timeseries(
            "PFC pause on the job's nodes (share of time)",
            [
                (
                    f"interface:lockstep_pfc_pause_seconds:ratio5m {ON_JOB_NODES}",
                    "{{instance}} {{interface}} {{direction}}",
                )
            ],
            "percentunit",
            thresholds=above((T.PFC_TX_PAUSE_RATIO, RED)),
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-slurm-job",
        "Lockstep / Slurm job",
        "One Slurm job: its nodes and GPUs, its ranks' step times against each other, its checkpoints and the "
        "fabric ports of its nodes.",
        [
            *job_summary(),
            *rank_stragglers(),
            *gpu_stragglers(),
            *step_times(),
            *framework(),
            *gpus(),
            *checkpoints(),
            *fabric(),
            *nccl.nccl(),
        ],
        variables=[CLUSTER, JOB_ID],
    )
