"""NCCL alerts from NCCL's own telemetry (issue 27), for jobs that write no step logs: the
collective straggler (Inspector: the rank every other rank waits for in its collectives) and the
collective hang (RAS: collective counts that stopped, ranks dead).  Their recording rules name
the suspects on the nodes of the ranks concerned, joined as the training straggler rules join
theirs (alerts/straggler_recording.py: a node's suspects by its host name, or here by the RAS
address its agent reports).
"""

from __future__ import annotations

from alerts.model import Alert, Group, Recording
from alerts.promql import VALUE_PERCENT, label, num
from alerts.straggler_recording import (
    HOST_INFO,
    HOST_SUSPECT,
    INSTANCE_SUSPECT,
    JOB_GPU_THROTTLED_ON_HOST,
    NODE_SUSPECTS,
    W,
)
from lockstep import thresholds as T
from lockstep.suspects import NCCL_RANK_SUSPECT

COMM_BY = "by (cluster, job_id, comm)"
COMM_ON = "on (cluster, job_id, comm)"
RANK_BY = "by (cluster, job_id, comm, rank, host)"
PER_OP = "job_comm_rank:lockstep_nccl_collective_seconds:per_op5m"
MEDIAN = "job_comm:lockstep_nccl_collective_seconds:median_per_op5m"
RANKS = "job_comm:lockstep_nccl_ranks:count5m"
WAIT_SHARE = "job_comm_rank:lockstep_nccl_peer_wait:share5m"
STRAGGLER_SUSPECT = NCCL_RANK_SUSPECT
STUCK_RANKS = "job_comm_rank:lockstep_nccl_stuck:info"
STUCK_SUSPECT = f"job_comm_rank:lockstep_nccl_stuck_suspect:active{W}"

STRAGGLERS = f"{WAIT_SHARE} > {num(T.NCCL_STRAGGLER_WAIT_SHARE)}\nand {COMM_ON} {RANKS} > {T.STRAGGLER_MIN_PEERS}"


def _suspect(record: str, name: str, expr: str) -> Recording:
    return Recording(record, expr, (("suspect", name),))


def _straggler_suspects() -> tuple[Recording, ...]:
    """The suspects on a straggling rank's node: its host (NCCL's hostname) joined to the node's
    agent as the training straggler rules do, and a throttled GPU of the job on that node."""
    slow = f"group {RANK_BY} ({STRAGGLERS})"
    rules = [
        _suspect(
            STRAGGLER_SUSPECT, name, f'{slow}\n* on (cluster, host) group_left ()\n{HOST_SUSPECT}{{suspect="{name}"}}'
        )
        for name in (suspect.name for suspect in NODE_SUSPECTS)
    ]
    rules.append(
        _suspect(
            STRAGGLER_SUSPECT,
            "gpu_throttle",
            f"{slow}\n* on (cluster, host, job_id) group_left ()\n{JOB_GPU_THROTTLED_ON_HOST}",
        )
    )
    return tuple(rules)


def _stuck_suspects() -> tuple[Recording, ...]:
    """The suspects on the nodes of a hung communicator's stuck ranks (STUCK_RANKS: with the
    instance of the agent that reports the rank's RAS address as its node's)."""
    stuck = f"group by (cluster, job_id, comm, rank, address, gpu, instance) ({STUCK_RANKS})"
    rules = [
        _suspect(
            STUCK_SUSPECT,
            name,
            f'{stuck}\n* on (cluster, instance) group_left ()\n{INSTANCE_SUSPECT}{{suspect="{name}"}}',
        )
        for name in (suspect.name for suspect in NODE_SUSPECTS)
    ]
    # The rank's own GPU lost or throwing XIDs: RAS's nvml_dev is the NVML index, the gpu label.
    rules.append(
        _suspect(
            STUCK_SUSPECT,
            "gpu_lost",
            f"{stuck}\n* on (cluster, instance, gpu) group_left ()\n"
            f"group by (cluster, instance, gpu) (min_over_time(lockstep_gpu_up[{W}]) == 0)",
        )
    )
    rules.append(
        _suspect(
            STUCK_SUSPECT,
            "gpu_xid",
            f"{stuck}\n* on (cluster, instance, gpu) group_left ()\n"
            f"group by (cluster, instance, gpu) (increase(lockstep_gpu_xid_errors_total[{W}]) > 0)",
        )
    )
    return tuple(rules)


# RAS: the ranks of a communicator that hold the others up (behind the furthest rank, or
# missing), with their address, GPU and, where an agent reports the address as its node's, that
# agent's instance.
_STUCK = (
    "group by (cluster, job_id, comm, rank, address, gpu) (\n"
    "  lockstep_nccl_rank_collectives_behind\n  or lockstep_nccl_missing_rank_info\n)"
)
STUCK_EXPR = (
    f"{_STUCK}\n* on (cluster, address) group_left (instance)\n"
    "group by (cluster, address, instance) (lockstep_nccl_ras_address_info)\n"
    f"or on (cluster, job_id, comm, rank)\n{_STUCK}"
)


NCCL_RECORDING = Group(
    "lockstep-nccl.recording",
    (
        # Each rank's mean time per collective over every collective type (every rank of a
        # communicator runs the same sequence, so the mix is the same for all).
        Recording(
            PER_OP,
            f"sum {RANK_BY} (rate(lockstep_nccl_collective_seconds_total[5m]))\n"
            f"/ (sum {RANK_BY} (rate(lockstep_nccl_collectives_total[5m])) > 0)",
        ),
        Recording(MEDIAN, f"quantile {COMM_BY} (0.5, {PER_OP})"),
        Recording(RANKS, f"count {COMM_BY} ({PER_OP})"),
        # The share of the median rank's collective time spent waiting for this rank: high only
        # for the rank that arrives last (the shortest time).
        Recording(WAIT_SHARE, f"1 - {PER_OP} / {COMM_ON} group_left () ({MEDIAN} > 0)"),
        *_straggler_suspects(),
        Recording(STUCK_RANKS, STUCK_EXPR),
        *_stuck_suspects(),
    ),
)


def _list(query: str, label_name: str, separator: str = ", ") -> str:
    return (
        f"{{{{ range $i, $s := {query} }}}}{{{{ if $i }}}}{separator}{{{{ end }}}}"
        f"{{{{ $s.Labels.{label_name} }}}}{{{{ end }}}}"
    )


STRAGGLER_SUSPECTS = (
    f'{{{{ $suspects := printf "{STRAGGLER_SUSPECT}{{cluster=%q, job_id=%q, comm=%q, rank=%q}}" '
    "$labels.cluster $labels.job_id $labels.comm $labels.rank | query }}"
    '{{ if $suspects }}{{ range $i, $s := sortByLabel "suspect" $suspects }}{{ if $i }}, {{ end }}'
    "{{ $s.Labels.suspect }}{{ end }}{{ else }}none found{{ end }}"
)
STUCK_LIST = (
    f'{{{{ $stuck := printf "{STUCK_RANKS}{{cluster=%q, job_id=%q, comm=%q}}" '
    "$labels.cluster $labels.job_id $labels.comm | query }}"
    '{{ range $i, $s := sortByLabel "rank" $stuck }}{{ if $i }}; {{ end }}rank {{ $s.Labels.rank }} on '
    "{{ with $s.Labels.instance }}{{ . }} ({{ $s.Labels.address }}){{ else }}{{ $s.Labels.address }}{{ end }}"
    " GPU {{ $s.Labels.gpu }}{{ end }}{{ if not $stuck }}none named{{ end }}"
)
STUCK_SUSPECTS = (
    f'{{{{ $suspects := printf "{STUCK_SUSPECT}{{cluster=%q, job_id=%q, comm=%q}}" '
    "$labels.cluster $labels.job_id $labels.comm | query }}"
    '{{ if $suspects }}{{ range $i, $s := sortByLabel "suspect" $suspects }}{{ if $i }}, {{ end }}'
    "{{ $s.Labels.suspect }} (rank {{ $s.Labels.rank }}){{ end }}{{ else }}none found{{ end }}"
)


def _dashboard_url() -> str:
    return (
        f"{T.GRAFANA_URL}/d/{T.SLURM_JOB_DASHBOARD_UID}/?var-cluster={{{{ $labels.cluster | urlquery }}}}"
        f"&var-job_id={{{{ $labels.job_id | urlquery }}}}"
    )


NCCL_ALERTS = (
    Alert(
        "LockstepNCCLStraggler",
        "warning",
        T.NCCL_STRAGGLER_FOR,
        # Labelled with the instance (and node) of the agent on the rank's host where known, so
        # Alertmanager inhibits it by that node's own fault alerts, as the training stragglers.
        f"(\n{STRAGGLERS}\n)\n* on (cluster, host) group_left (instance, node) {HOST_INFO}\n"
        f"or on (cluster, job_id, comm, rank)\n(\n{STRAGGLERS}\n)",
        f"Rank {label('rank')} of job {label('job_id')} holds up its NCCL collectives",
        f"In communicator {label('comm')} of job {label('job_id')}, every other rank waits for rank "
        f"{label('rank')} (host {label('host')}): its collectives are the shortest, and the communicator's "
        f"median rank spends {VALUE_PERCENT} of its collective time waiting for it (NCCL Inspector, "
        "5 min average). The job runs at this rank's pace. Suspects on its node in the last 30 minutes: "
        + STRAGGLER_SUSPECTS
        + ".",
        (("suspects", STRAGGLER_SUSPECTS), ("dashboard_url", _dashboard_url())),
    ),
    Alert(
        "LockstepNCCLHang",
        "critical",
        T.NCCL_HANG_FOR,
        # Dead ranks; or counts that stopped: no collective launched in the window by a
        # communicator that launched some before it (a finished job's communicators are gone
        # from RAS, and with them these series).
        f"max {COMM_BY} (lockstep_nccl_communicator_dead_ranks) > 0\n"
        f"or\nmax {COMM_BY} (changes(lockstep_nccl_communicator_collectives_total[{T.NCCL_HANG_WINDOW}])) == 0\n"
        f"and {COMM_ON}\nmax {COMM_BY} (lockstep_nccl_communicator_collectives_total offset {T.NCCL_HANG_WINDOW})"
        f" > 0\nand {COMM_ON}\nmax {COMM_BY} (lockstep_nccl_communicator_collectives_total)",
        f"Job {label('job_id')} hangs in NCCL communicator {label('comm')}",
        f"Communicator {label('comm')} of job {label('job_id')} makes no progress (NCCL RAS): its ranks "
        f"launched no collective for {T.NCCL_HANG_WINDOW}, or some of its ranks are dead. The ranks the "
        "others wait for: " + STUCK_LIST + ". Suspects on their nodes: " + STUCK_SUSPECTS + ".",
        (("suspects", STUCK_SUSPECTS), ("dashboard_url", _dashboard_url())),
    ),
)
