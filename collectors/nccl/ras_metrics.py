"""The NCCL RAS collector's metrics: the job's communicators (size, missing and dead ranks, how
far the furthest rank got, the ranks behind) and this node's own ranks' counts and status."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

COMM_LABELS = ("job_id", "comm")
REMOTE_RANK_LABELS = (*COMM_LABELS, "rank", "address", "gpu")

QUERIES = MetricSpec(
    "lockstep_nccl_ras_queries_total",
    "counter",
    "Status queries sent to NCCL's RAS service, by result: ok, failed (refused, timed out, too large, not the "
    "expected JSON), text_only (NCCL before 2.28.7 answers no JSON), untrusted (the answer was refused: the "
    "socket listening on the RAS port is not held by a process the answer names as this node's rank).",
    ("result",),
)
SKIPPED_RANKS = MetricSpec(
    "lockstep_nccl_ras_skipped_ranks_total",
    "counter",
    "This node's ranks (a rank per communicator) in RAS answers that were not exported, past max_node_ranks: "
    "each answer adds those it had past the cap.",
)
LEADER = MetricSpec(
    "lockstep_nccl_ras_leader",
    "gauge",
    "1 when this node hosts the lowest answering rank of the job's largest communicator and so queries RAS "
    "every round (role leader); 0 when it only re-checks now and then.",
)
INFO = MetricSpec(
    "lockstep_nccl_ras_info",
    "gauge",
    "The NCCL version of the job's RAS service, valued 1 (from this round's answer).",
    ("nccl_version",),
)
COLLECTION_SECONDS = MetricSpec(
    "lockstep_nccl_ras_collection_seconds",
    "gauge",
    "How long this round's status took to gather across the job (RAS's collection_time_sec).",
    unit="seconds",
)
ADDRESS_INFO = MetricSpec(
    "lockstep_nccl_ras_address_info",
    "gauge",
    "An address of this node that NCCL's RAS reports ranks on, valued 1: joins the rank series of the "
    "leader's view (address label) to this node.",
    ("address",),
)
COMM_RANKS = MetricSpec(
    "lockstep_nccl_communicator_ranks",
    "gauge",
    "Ranks the communicator has (its size).",
    COMM_LABELS,
)
COMM_MISSING = MetricSpec(
    "lockstep_nccl_communicator_missing_ranks",
    "gauge",
    "Ranks of the communicator that did not answer this round's RAS query (dead ones included).",
    COMM_LABELS,
)
COMM_DEAD = MetricSpec(
    "lockstep_nccl_communicator_dead_ranks",
    "gauge",
    "Ranks of the communicator whose process RAS considers dead (unreachable for 60 s).",
    COMM_LABELS,
)
COMM_COLLECTIVES = MetricSpec(
    "lockstep_nccl_communicator_collectives_total",
    "counter",
    "Collectives launched by the communicator's furthest rank: stops growing when the communicator hangs.",
    COMM_LABELS,
)
RANK_BEHIND = MetricSpec(
    "lockstep_nccl_rank_collectives_behind",
    "gauge",
    "For a rank that launched fewer collectives than the communicator's furthest rank: how many fewer. In a "
    "hang, the ranks behind are those the others wait for. At most max_listed_ranks per communicator.",
    REMOTE_RANK_LABELS,
)
MISSING_RANK = MetricSpec(
    "lockstep_nccl_missing_rank_info",
    "gauge",
    "A rank of the communicator that did not answer, valued 1; status: unresponsive, dead or missing. "
    "At most max_listed_ranks per communicator.",
    (*REMOTE_RANK_LABELS, "status"),
)
OWN_COLLECTIVES = MetricSpec(
    "lockstep_nccl_ras_collectives_total",
    "counter",
    "Collectives this node's rank launched on the communicator, by type (RAS collective_counts).",
    (*COMM_LABELS, "rank", "collective"),
)
OWN_RANK = MetricSpec(
    "lockstep_nccl_ras_rank_info",
    "gauge",
    "A rank of this node, valued 1: its GPU (NVML index) and status: running, initializing, finalizing, "
    "init_error, async_error or aborted.",
    (*COMM_LABELS, "rank", "gpu", "status"),
)
