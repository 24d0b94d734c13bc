"""The fleet overview: every node and GPU of the selected clusters, what is down, what fires, which
jobs run and their worst stragglers."""

from __future__ import annotations

from dashboards.board import Board
from dashboards.panels import NONE_BAD, RED, Cell, above, below, heatmap, stat, table, timeseries
from dashboards.variables import CLUSTER
from lockstep import thresholds as T
from lockstep.node_faults import GPUS_LOST_RECORD, NODE_FAULTS

# The fleet dashboard selects on the cluster only: it shows every node.
CL = 'cluster=~"$cluster"'
FIRING = f'ALERTS{{alertstate="firing", alertname=~"Lockstep.*", {CL}}}'


def headline_counts() -> list[Cell]:
    """Agents and GPUs up and lost, alerts firing, Slurm jobs running."""
    return [
        stat("Agents up", f'sum(up{{job="{T.AGENT_JOB}", {CL}}})', "none"),
        stat(
            "Agents down",
            f'count(up{{job="{T.AGENT_JOB}", {CL}}} == 0) or vector(0)',
            "none",
            "Agents Prometheus cannot scrape (LockstepAgentDown).",
            NONE_BAD,
        ),
        stat("GPUs up", f"sum(cluster:lockstep_gpu_up:sum{{{CL}}})", "none"),
        stat(
            "GPUs lost",
            f"count(lockstep_gpu_up{{{CL}}} == 0) or vector(0)",
            "none",
            "GPUs that stopped answering NVML (LockstepGPUFellOffBus).",
            NONE_BAD,
        ),
        stat(
            "Firing alerts",
            f"count({FIRING}) or vector(0)",
            "none",
            "Lockstep alerts firing now.",
            NONE_BAD,
        ),
        stat(
            "Running Slurm jobs",
            f"count(count by (cluster, job_id) (lockstep_slurm_job_info{{{CL}}})) or vector(0)",
            "none",
        ),
    ]


def firing_alerts() -> list[Cell]:
    """What is wrong now and where, from the alerts' own series."""
    return [
        table(
            "Stalled or straggling training jobs",
            [
                (
                    'ALERTS{alertstate="firing", '
                    'alertname=~"LockstepTrainingStalled|LockstepTrainingStraggler|LockstepGPUStraggler", '
                    f"{CL}}}",
                    "",
                )
            ],
            "none",
            "Which jobs are stalled or straggling now, and where: the job (cluster, job_id), and for a "
            "straggler the node (instance), rank or GPU. From the alerts' own series, so it costs the same at "
            "any fleet size.",
            hide=("Time", "__name__", "alertstate", "Value", "job", "severity"),
            width=24,
            height=6,
        ),
        table(
            "Firing alerts",
            [(FIRING, "")],
            "none",
            "Every Lockstep alert firing now, with the labels that say where; the runbook link is in the "
            "alert's annotations (docs/runbooks.md).",
            hide=("Time", "__name__", "alertstate", "Value", "job"),
            width=24,
        ),
    ]


def worst_stragglers() -> list[Cell]:
    """The ranks and GPUs furthest from their job's median."""
    return [
        table(
            "Worst training stragglers",
            [(f"topk(10, job_rank:lockstep_training_compute_seconds:ratio_to_median5m{{{CL}}})", "")],
            "suffix:x",
            "Ranks by their compute time per step against their job's median rank (5 min). "
            f"LockstepTrainingStraggler fires above {T.TRAINING_STRAGGLER_COMPUTE_RATIO}x for 10 minutes.",
            above((T.TRAINING_STRAGGLER_COMPUTE_RATIO, RED)),
        ),
        table(
            "Slowest GPUs against their job",
            [(f"bottomk(10, job_gpu:lockstep_gpu_sm_clock_hertz:ratio_to_median5m{{{CL}}})", "")],
            "percentunit",
            "Busy GPUs by their SM clock against the median of their Slurm job's GPUs (5 min). "
            f"LockstepGPUStraggler fires below {T.GPU_STRAGGLER_SM_CLOCK_RATIO:.0%} for 10 minutes.",
            below(T.GPU_STRAGGLER_SM_CLOCK_RATIO),
        ),
    ]


def nodes_that_hurt_jobs() -> list[Cell]:
    """The nodes named by the most jobs' straggler and hang alerts: which to drain (alerts/nodes.py)."""
    return [
        table(
            "Nodes that hurt jobs",
            [(f"topk(20, instance:lockstep_jobs_hurt:count7d{{{CL}}})", "")],
            "none",
            f"Nodes by the distinct jobs whose straggler or hang alerts named them, or whose checkpoint saves "
            "they stalled, in the last "
            f"{T.NODE_RECORD_WINDOW}. LockstepNodeHurtsJobs fires at {T.NODE_JOBS_HURT}: a node that keeps "
            "hurting jobs while passing the checks between them. `lockstep health-check` on the node says "
            "whether it needs a repair now (docs/health-check.md).",
            above((T.NODE_JOBS_HURT, RED)),
        ),
        table(
            "Nodes' own faults",
            [(f"sum by (cluster, instance) ({record}{{{CL}}})", "") for record, _ in OWN_FAULTS],
            "none",
            f"What each node showed itself in the last {T.NODE_RECORD_WINDOW} (lockstep/node_faults.py), one "
            "column a fault, nodes with none left out. `lockstep report --node NAME` tells a node's story: "
            "which GPU or port, and the jobs it hurt.",
            rename={f"Value #{letter}": title for letter, (_, title) in zip("ABCDEFGH", OWN_FAULTS)},
        ),
    ]


# The node record's faults as the fleet table's columns (its record, its column's title).
OWN_FAULTS = (
    *((fault.record, fault.says + (" (s)" if fault.unit == "s" else "")) for fault in NODE_FAULTS),
    (GPUS_LOST_RECORD, "GPUs lost at once (most)"),
)


def gpu_utilization() -> list[Cell]:
    """GPU utilization by cluster, and across nodes as a heatmap."""
    return [
        timeseries(
            "GPU utilization by cluster",
            [(f"cluster:lockstep_gpu_utilization_ratio:avg{{{CL}}}", "{{cluster}}")],
            "percentunit",
            "Mean utilization of the GPUs that report it (GPUs in MIG mode do not).",
        ),
        heatmap(
            "GPU utilization across nodes",
            f"instance:lockstep_gpu_utilization_ratio:avg{{{CL}}}",
            "percentunit",
            "How many nodes run their GPUs at which mean utilization: a band at the bottom is idle or stalled "
            "nodes. Per node, not per GPU: one series a node keeps the panel fast at a thousand nodes "
            "(docs/performance.md); the GPU dashboard shows each GPU.",
        ),
    ]


def board() -> Board:
    return Board(
        "lockstep-fleet",
        "Lockstep / Fleet overview",
        "Every node and GPU of the selected clusters: what is down, what fires, which jobs run and their worst "
        "stragglers.",
        [*headline_counts(), *firing_alerts(), *worst_stragglers(), *nodes_that_hurt_jobs(), *gpu_utilization()],
        variables=[CLUSTER],
    )
