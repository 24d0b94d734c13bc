"""The Slurm collector's metrics: jobs on this node, their GPUs, the node's state, requests to slurmctld."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

JOB_INFO = MetricSpec(
    "lockstep_slurm_job_info",
    "gauge",
    "A Slurm job running on this node; always 1. Join on job_id for the job's user, account, "
    "partition and name (array_job_id/array_task_id empty for non-array jobs).",
    ("job_id", "user", "account", "partition", "job_name", "array_job_id", "array_task_id"),
)
JOB_GPU_INFO = MetricSpec(
    "lockstep_slurm_job_gpu_info",
    "gauge",
    "A GPU of this node allocated to a Slurm job; always 1. gpu is the NVML index, as on lockstep_gpu_* series.",
    ("job_id", "gpu", "uuid"),
)
JOB_GPU_SM = MetricSpec(
    "lockstep_slurm_job_gpu_sm_utilization_ratio",
    "gauge",
    "Share of the GPU's SM time used by the job's processes in NVML's newest per-process sample of the last two "
    "rounds: on a GPU shared by several jobs (oversubscribed GRES, MPS), each one's part.",
    ("job_id", "gpu", "uuid"),
    unit="ratio",
)
JOB_GPU_MEMORY = MetricSpec(
    "lockstep_slurm_job_gpu_memory_utilization_ratio",
    "gauge",
    "Share of the GPU's memory bandwidth (time device memory was read or written) used by the job's processes "
    "in NVML's newest per-process sample of the last two rounds.",
    ("job_id", "gpu", "uuid"),
    unit="ratio",
)
JOB_CPU = MetricSpec(
    "lockstep_slurm_job_cpu_seconds_total",
    "counter",
    "CPU time used by the job's processes on this node (from its cgroup).",
    ("job_id",),
    unit="seconds",
)
JOB_MEMORY = MetricSpec(
    "lockstep_slurm_job_memory_used_bytes",
    "gauge",
    "Memory charged to the job's cgroup on this node, page cache included (what its memory limit applies to).",
    ("job_id",),
    unit="bytes",
)
JOB_OOM = MetricSpec(
    "lockstep_slurm_job_oom_kills_total",
    "counter",
    "Processes of the job killed by the kernel's OOM killer on this node (cgroups that report it).",
    ("job_id",),
)
JOB_PROCESSES = MetricSpec("lockstep_slurm_job_processes", "gauge", "Processes of the job on this node.", ("job_id",))
NODE_INFO = MetricSpec(
    "lockstep_slurm_node_info",
    "gauge",
    "This node as slurmctld sees it; always 1. slurm_node is its Slurm name, state Slurm's (e.g. MIXED+DRAIN), "
    "reason the admin's.",
    ("slurm_node", "state", "reason"),
)
NODE_STATE = MetricSpec(
    "lockstep_slurm_node_state",
    "gauge",
    "1 for each state flag this node has now (idle, mixed, allocated, down, drain, ...).",
    ("state",),
)
GPU_MISMATCHES = MetricSpec(
    "lockstep_slurm_gpu_attribution_mismatches",
    "gauge",
    "GPUs running processes of a job other than the one Slurm allocated them to.",
)
CONTROLLER_REQUESTS = MetricSpec(
    "lockstep_slurm_controller_requests_total",
    "counter",
    "Commands run by this agent that reach slurmctld, by command.",
    ("command",),
)
CONTROLLER_FAILURES = MetricSpec(
    "lockstep_slurm_controller_failures_total",
    "counter",
    "Commands to slurmctld that failed or timed out, by command.",
    ("command",),
)
SKIPPED_GPU_LISTS = MetricSpec(
    "lockstep_slurm_skipped_gpu_lists_total",
    "counter",
    "Jobs whose GPU index list (SLURM_JOB_GPUS or SLURM_STEP_GPUS in the job's environment, which its user "
    "sets) was refused since the agent started: not N or N-M parts, or more than 4096 indices. Counted once "
    "per job; that job's GPUs are then attributed from its processes only.",
)
