"""The NCCL Inspector collector's metrics: per rank, communicator and operation counters from
which rates give the time per collective and the bus bandwidth, and the state of the reading."""

from __future__ import annotations

from lockstep.agent.collector import MetricSpec

RANK_LABELS = ("job_id", "comm", "rank", "host")
COLLECTIVE_LABELS = (*RANK_LABELS, "collective")
P2P_LABELS = (*RANK_LABELS, "operation")

COLLECTIVES = MetricSpec(
    "lockstep_nccl_collectives_total",
    "counter",
    "Collectives the rank completed on the communicator (NCCL Inspector records; from a plugin before 2.30.3, "
    "which writes samples, NCCL's own count from coll_sn).",
    COLLECTIVE_LABELS,
)
COLLECTIVE_SECONDS = MetricSpec(
    "lockstep_nccl_collective_seconds_total",
    "counter",
    "Execution time of the rank's collectives (NCCL's coll_exec_time_us, GPU-timed by default). A collective "
    "runs until every rank has joined: the rank the others wait for has the shortest time.",
    COLLECTIVE_LABELS,
    unit="seconds",
)
COLLECTIVE_BYTES = MetricSpec(
    "lockstep_nccl_collective_bytes_total",
    "counter",
    "Message bytes of the rank's collectives (coll_msg_size_bytes); over the seconds' rate: algorithm bandwidth.",
    COLLECTIVE_LABELS,
    unit="bytes",
)
COLLECTIVE_BUS_BYTES = MetricSpec(
    "lockstep_nccl_collective_bus_bytes_total",
    "counter",
    "Bus bandwidth times execution time of the rank's collectives (coll_busbw_gbs x coll_exec_time_us): "
    "its rate over the seconds' rate is the bus bandwidth, comparable across collective types.",
    COLLECTIVE_LABELS,
    unit="bytes",
)
P2P_OPERATIONS = MetricSpec(
    "lockstep_nccl_p2p_operations_total",
    "counter",
    "Point-to-point operations (Send, Recv) the rank completed on the communicator, of those the plugin wrote "
    "(2.30.3+; 2.30.7 drops most of them, docs/workloads.md).",
    P2P_LABELS,
)
P2P_SECONDS = MetricSpec(
    "lockstep_nccl_p2p_seconds_total",
    "counter",
    "Execution time of the rank's point-to-point operations (p2p_exec_time_us).",
    P2P_LABELS,
    unit="seconds",
)
P2P_BYTES = MetricSpec(
    "lockstep_nccl_p2p_bytes_total",
    "counter",
    "Message bytes of the rank's point-to-point operations (p2p_msg_size_bytes).",
    P2P_LABELS,
    unit="bytes",
)
RANK_INFO = MetricSpec(
    "lockstep_nccl_rank_info",
    "gauge",
    "A rank of a communicator seen in NCCL Inspector dumps, valued 1: the communicator's name, size and node "
    "count, the GPU (NVML index and UUID, from the writing process) when it runs on this node, and records: "
    "all (plugin 2.30.3+, one record per operation) or sampled (before 2.30.3, the latest collective per "
    "communicator at each dump: counts exact from coll_sn, seconds and bytes estimated from the samples).",
    (*RANK_LABELS, "comm_name", "n_ranks", "nnodes", "gpu", "uuid", "records"),
)
FILES = MetricSpec("lockstep_nccl_inspector_files", "gauge", "NCCL Inspector dump files being followed.")
SKIPPED = MetricSpec(
    "lockstep_nccl_inspector_lines_skipped_total",
    "counter",
    "Inspector dump lines skipped: not_json, bad_record (a field missing, of the wrong type or out of range), "
    "unsupported_format (an inspector_output_format_version other than v4.x), too_long (no newline within "
    "64 KiB), series_limit (a new rank, communicator or operation beyond max_series).",
    ("reason",),
)
