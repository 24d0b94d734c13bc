"""The sustained straggler rules: each rank's (each busy GPU's) 30-minute mean against its job's
median and median absolute deviation (MAD), and the suspects on a slow rank's node."""

from __future__ import annotations

from alerts.model import Group, Recording
from alerts.promql import JOB_ON, by, job_by, num, on
from lockstep import thresholds as T
from lockstep.suspects import (
    DATA_WAIT_SHARE,
    FABRIC_SUSPECTS,
    GPU_THROTTLE,
    GPU_THROTTLE_CLAUSE,
    HOST_SUSPECT,
    NODE_SUSPECTS,
    RANK_SUSPECT,
    NodeSuspect,
)
from lockstep.suspects import NODE_SUSPECT as INSTANCE_SUSPECT

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


RATIO_30M = f"job_rank:{WORK}:ratio_to_median{W}"

# The evidence test (LockstepTrainingStragglerSustained): each rank's 5-minute time per step over
# its peers', and whether it arrives last at the collectives, recorded at every evaluation so
# that the alert can judge how they held over STRAGGLER_EVIDENCE_WINDOW.
PEERS_5M = f"job_rank:{WORK}:ratio_to_peers5m"
COMM_WAIT_5M = "job_rank:lockstep_training_comm_wait_seconds:mean5m"  # lockstep-training.recording
LAST_TO_ARRIVE = "job_rank:lockstep_training_last_to_arrive:bool5m"
RANKS_5M = f"count {job_by()} (job_rank:{WORK}:mean5m)"


def _evidence() -> tuple[Recording, ...]:
    """The ratio to the peers: to the job's median rank's time in jobs of 3 ranks or more (the
    rank's own time moves the median little), to the one peer's in a 2-rank job (there the
    median is the mean of the two, and a rank 10 % slower than its peer is 4.8 % above it).
    The last to arrive: the rank whose 5-minute mean wait in collectives is its job's least (1)
    or not (0), for jobs whose ranks report comm wait."""
    return (
        Recording(f"job:{WORK}:sum5m", f"sum {job_by()} (job_rank:{WORK}:mean5m)"),
        Recording(
            PEERS_5M,
            f"job_rank:{WORK}:ratio_to_median5m and {JOB_ON} {RANKS_5M} > 2\n"
            f"or\njob_rank:{WORK}:mean5m\n"
            f"/ (job:{WORK}:sum5m - {JOB_ON} group_right () job_rank:{WORK}:mean5m > 0)\n"
            f"and {JOB_ON} {RANKS_5M} == 2",
        ),
        Recording(
            LAST_TO_ARRIVE,
            f"{COMM_WAIT_5M}\n== bool {JOB_ON} group_left ()\nmin {job_by()} ({COMM_WAIT_5M})\n"
            f"and {JOB_ON} count {job_by()} ({COMM_WAIT_5M}) > 1",
        ),
    )


# The verdicts, each valued at the rank's mean ratio to its peers over a window.  Slower than its
# peers (LockstepTrainingSlowerThanPeers, a ticket): the sequential test of thresholds.py, the
# mean over 5, 10 or 20 minutes past a threshold that falls as the window grows.  Holds the job
# back (LockstepTrainingStragglerSustained): the persistent test, that ratio at every evaluation
# of the 20-minute window averaged above the ratio and held above the floor in all but the spare
# share, judged since STRAGGLER_EVIDENCE_SINCE, and the rank the last to arrive at the collectives
# for at least half the window, where its job reports comm wait.  The hold: what keeps a firing
# alert of either, the mean over the shorter hold window above the hold ratio (each alert joins it
# to its own state).
EW = T.STRAGGLER_EVIDENCE_WINDOW
SLOWER = f"job_rank:lockstep_training_slower_than_peers:ratio{EW}"
EVIDENCE = f"job_rank:lockstep_training_straggler_evidence:ratio{EW}"
HOLD = f"job_rank:lockstep_training_straggler_hold:ratio{EW}"


def sequential_threshold(window: str) -> float:
    """The sequential test's threshold for a window's mean ratio (thresholds.py): the reference
    plus the evidence (ratio-minutes) spread over the window's minutes."""
    minutes = int(window.removesuffix("m"))
    return round(T.TRAINING_SLOWER_REFERENCE_RATIO + T.TRAINING_SLOWER_EVIDENCE_RATIO_MINUTES / minutes, 6)


def _sequential() -> str:
    """LockstepTrainingSlowerThanPeers' test: the mean ratio over some window past its threshold,
    the longest window first (its mean is the value), with the window's history there, the
    longest window also above the floor in all but the spare share of it, and the rank still above
    the reference now.  Each selector costs about as much as any other here, an instant one
    (`offset`) as a range (a series' chunk is decoded from its start either way): at 1,024 nodes x
    8 ranks about 0.14 s an evaluation each (bench/straggler_rules.py, docs/performance.md), so
    the test reads as few as it can: a mean and a history per window, one floor."""
    longest = T.STRAGGLER_SEQUENTIAL_WINDOWS[-1]
    floor = (
        f"\nand quantile_over_time({num(T.STRAGGLER_EVIDENCE_SPARE)}, {PEERS_5M}[{longest}])"
        f" > {num(T.TRAINING_STRAGGLER_EVIDENCE_FLOOR)}"
    )
    windows = "\nor\n".join(
        f"avg_over_time({PEERS_5M}[{w}]) > {num(sequential_threshold(w))}"
        f"{floor if w == longest else ''}\nand {PEERS_5M} offset {w}"
        for w in reversed(T.STRAGGLER_SEQUENTIAL_WINDOWS)
    )
    return f"(\n{windows}\n)\nand {PEERS_5M} > {num(T.TRAINING_SLOWER_REFERENCE_RATIO)}"


def _verdicts() -> tuple[Recording, Recording, Recording]:
    """The two verdicts and the hold.  Each verdict judges its windows itself: the second reading
    the first's record would see it only once written, which vmalert does through
    VictoriaMetrics' remote write, seconds later (tests/simulation/test_scale_out_e2e.py: the
    paging verdict missed its deadline there when it read the first)."""
    mean_ratio = f"avg_over_time({PEERS_5M}[{EW}])"
    persistently_slower = (
        f"{mean_ratio} > {num(T.TRAINING_STRAGGLER_EVIDENCE_RATIO)}\n"
        f"and\nquantile_over_time({num(T.STRAGGLER_EVIDENCE_SPARE)}, {PEERS_5M}[{EW}])"
        f" > {num(T.TRAINING_STRAGGLER_EVIDENCE_FLOOR)}\n"
        f"and\n{PEERS_5M} offset {T.STRAGGLER_EVIDENCE_SINCE}"
    )
    return (
        Recording(SLOWER, _sequential()),
        Recording(
            EVIDENCE,
            f"{persistently_slower}\n"
            f"and\n(\n  avg_over_time({LAST_TO_ARRIVE}[{EW}]) >= {num(T.STRAGGLER_LAST_TO_ARRIVE_SHARE)}\n"
            f"  or {PEERS_5M} unless on (cluster, job_id, rank) {COMM_WAIT_5M}\n)",
        ),
        Recording(
            HOLD,
            f"{mean_ratio}\nand\navg_over_time({PEERS_5M}[{T.STRAGGLER_HOLD_WINDOW}])"
            f" > {num(T.TRAINING_STRAGGLER_HOLD_RATIO)}",
        ),
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


HOST_INFO = "instance:lockstep_host:info"
# The (cluster, host, job_id) whose job has a thermally or power throttled GPU on that host: which
# GPU runs which rank is not known, so a rank's suspect is a throttled GPU of its job on its node.
JOB_GPU_THROTTLED_ON_HOST = (
    "group by (cluster, host, job_id) (\n"
    f"  max by ({TARGET}, uuid) ({GPU_THROTTLE})\n"
    f"  * on ({TARGET}, uuid) group_right () lockstep_slurm_job_gpu_info\n"
    f"  * on (cluster, instance) group_left (host) {HOST_INFO}\n)"
)


def _node_suspect(suspect: NodeSuspect) -> Recording:
    """A node's suspect, as lockstep/suspects.py defines it: a sample per target that shows it."""
    return _suspect(INSTANCE_SUSPECT, suspect.name, f"group {by()} (\n  {suspect.rule()}\n)")


# Ranks slow enough by the relative margin to be given suspects, and the ranks the sequential
# ticket names: it fires in minutes, before a 30-minute mean is past the margin, and names its
# rank's suspects as the page does (tests/alerts/test_pages_e2e.py: "none found" otherwise).
SLOW_RANKS = f"job_rank:{WORK}:ratio_to_median{W} > {num(T.TRAINING_STRAGGLER_SUSTAINED_RATIO)}\nor {SLOWER}"


def _rank_suspects() -> tuple[Recording, ...]:
    """Each slow rank gets its node's suspects.  A rank's series come from whichever agent reads
    its log (on a shared filesystem, maybe not its own node's), so the join is on the rank's
    host label, which instance:lockstep_host:info maps to the node's agent."""
    slow = f"group by ({TARGET}, job_id, rank, host) ({SLOW_RANKS})"
    rules = [
        _suspect(RANK_SUSPECT, name, f'{slow}\n* on (cluster, host) group_left ()\n{HOST_SUSPECT}{{suspect="{name}"}}')
        for name in (suspect.name for suspect in NODE_SUSPECTS)
    ]
    # A throttled GPU of the same job on the rank's node (which GPU runs which rank is not known).
    rules.append(
        _suspect(
            RANK_SUSPECT,
            "gpu_throttle",
            f"{slow}\n* on (cluster, host, job_id) group_left ()\n{JOB_GPU_THROTTLED_ON_HOST}",
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
            f"{slow}\nand on ({TARGET}, job_id, rank, host)\n{data_excess}\n> {num(DATA_WAIT_SHARE)} * {excess}",
        )
    )
    return tuple(rules)


# The straggler records in ten groups, each after the groups it reads (alerts/rules.py): a
# Prometheus evaluates each group in turn on one goroutine, so at 1,024 nodes x 8 ranks one
# group of them all took 4.4 s; split, each takes about a second or less (docs/performance.md).
# A record read across groups is up to one evaluation older than within one: the evidence path
# (5m, peers, evidence, then the alert) is three such steps, 45 s at most.
SLOWER_RULE, EVIDENCE_RULE, HOLD_RULE = _verdicts()
STRAGGLER_RECORDING_GROUPS = (
    # Each rank's 5-minute time per step, and over its job's median.
    Group(
        "lockstep-stragglers-5m.recording",
        (
            _work_per_step("5m"),
            Recording(f"job:{WORK}:median5m", f"quantile {job_by()} (0.5, job_rank:{WORK}:mean5m)"),
            Recording(
                f"job_rank:{WORK}:ratio_to_median5m",
                f"job_rank:{WORK}:mean5m\n/ {JOB_ON} group_left ()\njob:{WORK}:median5m",
            ),
        ),
    ),
    # Each rank's 5-minute time per step over its peers', and whether it arrives last at the
    # collectives: read at every evaluation by the evidence test.
    Group("lockstep-stragglers-peers.recording", _evidence()),
    # The evidence test's verdicts, judged once for the two straggler alerts: each reads 20
    # minutes of every rank's records, so each verdict and the hold have a group of their own.
    Group("lockstep-stragglers-evidence.recording", (EVIDENCE_RULE,)),
    Group("lockstep-stragglers-slower.recording", (SLOWER_RULE,)),
    Group("lockstep-stragglers-hold.recording", (HOLD_RULE,)),
    # Each rank's 30-minute time per step against its job's (the suspects' slow ranks, the
    # dashboards).
    Group("lockstep-stragglers-30m.recording", (_work_per_step(W), *_median_and_mad("job_rank", WORK, W))),
    # Each busy GPU's 30-minute pace against its job's (LockstepGPUStragglerSustained).
    Group(
        "lockstep-stragglers-gpu.recording",
        (
            Recording(f"job_gpu:lockstep_gpu_sm_clock_hertz:avg{W}", _gpu_pace(W)),
            *_median_and_mad("job_gpu", "lockstep_gpu_sm_clock_hertz", W),
        ),
    ),
    # What each node showed in the window: its suspects, the fabric's (every port's counters)
    # apart from the rest.
    Group(
        "lockstep-stragglers-fabric-suspects.recording",
        tuple(_node_suspect(suspect) for suspect in NODE_SUSPECTS if suspect.name in FABRIC_SUSPECTS),
    ),
    Group(
        "lockstep-stragglers-node-suspects.recording",
        tuple(_node_suspect(suspect) for suspect in NODE_SUSPECTS if suspect.name not in FABRIC_SUSPECTS),
    ),
    # Which host each node is, its throttled GPUs, and its suspects by host.
    Group(
        "lockstep-stragglers-nodes.recording",
        (
            # Which host each agent runs on, for ranks whose series another agent exports:
            # the Slurm node name, else the Kubernetes node name the scrape adds.
            # One agent per host (topk): the joins on it must find one, or PromQL refuses them.
            Recording(
                HOST_INFO,
                f"topk by (cluster, host) (\n  1,\n  max by ({TARGET}, host) (\n"
                '    label_replace(lockstep_slurm_node_info{slurm_node!=""}, "host", "$1", "slurm_node", "(.+)")\n'
                f"    or on (cluster, instance)\n"
                f"    label_replace(\n"
                f'      group by ({TARGET}) (lockstep_build_info{{node!=""}}), "host", "$1", "node", "(.+)"\n'
                "    )\n"
                "  )\n)",
            ),
            Recording(GPU_THROTTLE, GPU_THROTTLE_CLAUSE.rule()),
            Recording(
                HOST_SUSPECT,
                f"max by (cluster, host, suspect) (\n  {INSTANCE_SUSPECT}\n"
                f"  * on (cluster, instance) group_left (host) {HOST_INFO}\n)",
            ),
        ),
    ),
    # Each slow rank's suspects: its node's, and its own data wait.
    Group(
        "lockstep-stragglers-suspects.recording",
        (
            Recording(
                f"job_rank:lockstep_training_data_wait_seconds:mean{W}",
                f"rate(lockstep_training_data_wait_seconds_total[{W}])\n"
                f"/ (rate(lockstep_training_steps_total[{W}]) > 0)",
            ),
            Recording(
                f"job:lockstep_training_data_wait_seconds:median{W}",
                f"quantile {job_by()} (0.5, job_rank:lockstep_training_data_wait_seconds:mean{W})",
            ),
            *_rank_suspects(),
        ),
    ),
)
