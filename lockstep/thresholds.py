"""Every threshold Lockstep judges by, in one place, installed with the agent.

Everything that judges imports this module, so nothing holds a copy: the rule modules in
alerts/ (rendered to alerts/*.rules.yml and deploy/prometheusrule.yaml; alerts/rules.py lists
them), the dashboards (dashboards/boards/ draw these numbers as threshold lines and colours),
`lockstep report` (lockstep/report/: its notes, and its judging where Prometheus recorded no
verdict) and the health checks.  What a node's suspect cause is lives beside it, as data, in
lockstep/suspects.py.  Change a value, then regenerate the rules and dashboards:

    .venv/bin/python -m alerts --write && .venv/bin/python -m dashboards --write

The promtool unit tests (alerts/tests/) probe values on both sides of these thresholds, so
they fail when one moves without them: update them together.
"""

from __future__ import annotations

# --- Where runbook links point and which scrape job is the agent -----------------------------

# Each alert's runbook_url is RUNBOOK_BASE_URL + "#" + the alert name in lower case (the anchor
# GitHub gives the alert's heading in docs/runbooks.md).  Point it at your own copy of the
# runbooks (a fork, an internal wiki mirror) and regenerate.
RUNBOOK_BASE_URL = "https://github.com/lockstep-observability/lockstep/blob/main/docs/runbooks.md"

# The Prometheus scrape job of the agents: the ServiceMonitor in deploy/ gives it the Service's
# name, "lockstep"; on bare metal, name your scrape job so (docs/alerting.md).
AGENT_JOB = "lockstep"

# Labels Prometheus attaches to every series of a target, kept by every aggregation so an alert
# still says where it fired: cluster (a target label or external label you set), instance (the
# agent's address) and node (the Kubernetes node name, set by deploy/servicemonitor.yaml).
# Missing labels are harmless in PromQL's by()/on().
TARGET_LABELS = ("cluster", "instance", "node")

# --- Training stragglers and stalls -----------------------------------------------------------

# A rank is a straggler when its compute time per step, averaged over 5 minutes, is this many
# times its job's median rank's.  (NVIDIA's resiliency extension flags a rank at 1/0.75 = 1.33x
# the fastest rank; against the median, 1.25x flags the same rank a little earlier.)
TRAINING_STRAGGLER_COMPUTE_RATIO = 1.25
# A GPU is a straggler when its SM clock, averaged over 5 minutes, is below this fraction of the
# median SM clock of its Slurm job's GPUs ...
GPU_STRAGGLER_SM_CLOCK_RATIO = 0.85
# ... counting only GPUs busier than this (an idle GPU drops its clock, which is not straggling).
GPU_STRAGGLER_MIN_UTILIZATION = 0.5
# Peers needed before anyone can be a straggler: a single-rank (single-GPU) job never is.
STRAGGLER_MIN_PEERS = 2
# The sensitive GPU detector (LockstepGPUStragglerSustained) catches a busy GPU a few percent
# slower than its job's for half an hour, which the ratio above misses: it must stand out by both
# margins below in its 30-minute mean, and still be slow in its 5-minute mean, for 'for'.
STRAGGLER_SUSTAINED_WINDOW = "30m"
STRAGGLER_SUSTAINED_FOR = "10m"
# Relative margin: a GPU's SM clock below this fraction of its job's median busy GPU's ...
GPU_STRAGGLER_SUSTAINED_RATIO = 0.95
# ... still slow now, by half the relative margin in its 5-minute mean, so that a short episode
# that has ended (a blip) does not keep its 30-minute mean up long enough to fire ...
GPU_STRAGGLER_SUSTAINED_NOW_RATIO = 0.975
# ... and statistical margin: further from the median than this many times the job's median
# absolute deviation (MAD).
STRAGGLER_SUSTAINED_MADS = 3
# GPUs a job needs before the sensitive GPU detector judges it: a median and a spread need a few.
STRAGGLER_SUSTAINED_MIN_PEERS = 3
# Where the training stragglers' 30-minute means are shown (dashboards, suspects): a rank slower
# than this many times its job's median over 30 minutes gets its node's suspects.
TRAINING_STRAGGLER_SUSTAINED_RATIO = 1.05

# The evidence test of LockstepTrainingStragglerSustained (docs/alerting.md, "How a straggler is
# found"): a rank's time per step of its own work (compute + data wait), averaged over 5 minutes,
# over its peers' (the job's median rank's; in a 2-rank job, its one peer's), judged at every
# evaluation of the last STRAGGLER_EVIDENCE_WINDOW.  It is named when that ratio averaged this
# many times or more ...
TRAINING_STRAGGLER_EVIDENCE_RATIO = 1.05
# ... stayed above this in all but STRAGGLER_EVIDENCE_SPARE of the window's evaluations (its
# STRAGGLER_EVIDENCE_SPARE quantile; a healthy rank's 5-minute ratio crosses 1 both ways within
# minutes: seen in every real run, tests/fixtures/training/) ...
TRAINING_STRAGGLER_EVIDENCE_FLOOR = 1.03
STRAGGLER_EVIDENCE_SPARE = 0.1
STRAGGLER_EVIDENCE_WINDOW = "20m"
# ... the rank was judged this long ago already (the window holds that much evidence: a job's
# first minutes, or a rank that just joined, are not judged on a few samples) ...
STRAGGLER_EVIDENCE_SINCE = "15m"
# ... and, where the job reports its ranks' waiting in collectives (comm_wait_time_sec), the rank
# waited least of its job's ranks (it arrives last: the one the others wait for) in at least this
# share of the window's evaluations.  A rank slower than the median that no one waits for is not
# holding the job back (a second straggler behind a worse one is named once the first is fixed).
STRAGGLER_LAST_TO_ARRIVE_SHARE = 0.5
STRAGGLER_EVIDENCE_FOR = "3m"
# LockstepTrainingSlowerThanPeers' own test (issue 44), sequential: the same 5-minute ratio to the
# peers, its mean over each window of STRAGGLER_SEQUENTIAL_WINDOWS against a threshold that falls
# as the window grows, TRAINING_SLOWER_REFERENCE_RATIO + TRAINING_SLOWER_EVIDENCE_RATIO_MINUTES /
# (the window in minutes): 1.07 over 5 minutes, 1.0475 over 20; over the longest window the ratio
# also stays above TRAINING_STRAGGLER_EVIDENCE_FLOOR in all but STRAGGLER_EVIDENCE_SPARE of it;
# the window's history is there (a job's first minutes are judged on the 5-minute window only),
# and the rank is above the reference now.  A CUSUM (the ratio's excess over the reference,
# summed in ratio-minutes, past a decision interval) judged at two onsets instead of every one:
# a large excess (10 %) is certain after 5 minutes, a small one (5 %) after 20.  Two windows, not
# three: at fleet scale each selector costs about the same, a range or an offset (a 10-minute
# window named the real 7 % rank in 11.5 minutes instead of 14.25, and made the group cost 1.7
# times this one: docs/performance.md).  Each window's threshold is 5.8 or more standard
# deviations of a healthy rank's mean over it (the real runs of tests/fixtures/training at their
# own timestamps: a healthy rank's 5-minute ratio has a standard deviation of 0.007-0.022, 0.012
# typically, and read 1.040 at most, never above the reference): with windows taken as
# independent and normal, one false ticket in about 22 weeks at 1,024 nodes x 8 ranks training
# all week (docs/alerting.md, "How a straggler is found").  The paging verdict
# (LockstepTrainingStragglerSustained) keeps its 20-minute persistence: a rank slowed for 5
# minutes (a transient) is named by this ticket, never paged.
TRAINING_SLOWER_REFERENCE_RATIO = 1.04
TRAINING_SLOWER_EVIDENCE_RATIO_MINUTES = 0.15
STRAGGLER_SEQUENTIAL_WINDOWS = ("5m", "20m")
STRAGGLER_SLOWER_FOR = "1m"
# Once firing, the alert holds while the rank's ratio averaged over this window stays above this
# (a slow rank that the machine's noise pulls under the floor for a few minutes is still slow:
# no resolve and fire again).
STRAGGLER_HOLD_WINDOW = "10m"
TRAINING_STRAGGLER_HOLD_RATIO = 1.025
# A job is judged by the straggler alerts only while it runs: it completed a step within this
# window, or Slurm runs it, or its ranks' processes still hold their logs open (a pause for a
# checkpoint save).  A job that ended is no straggler job: its 5- and 30-minute windows would
# otherwise keep an alert up, or even make one, after the end.
# (A window, not a comparison with time(): the last step's timestamp changed in it, so the clocks of
# the ranks' hosts and of Prometheus need not agree, and test-time compression scales it.)
TRAINING_STEPPED_WITHIN = "2m"

# --- Suspects: what else the straggler's node shows in the same 30 minutes -------------------

# A GPU throttled by one of these clock event reasons for at least this share of the window.
# (sw_power_cap is left out: a busy GPU at its power limit is normal.)
SUSPECT_GPU_THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake")
SUSPECT_GPU_THROTTLE_SHARE = 0.1
# PFC pause (either direction) on one of the node's interfaces for this share of the time.
SUSPECT_PFC_PAUSE_RATIO = 0.02
# InfiniBand congestion: transmit wait (as for LockstepIBCongestion) above this share.  Any
# symbol error, link recovery, link down or receive error in the window counts as ib_errors.
SUSPECT_IB_TRANSMIT_WAIT_RATIO = 0.05
# Data wait: the rank's data wait per step exceeds its job's median by more than this share of
# its excess time per step (the loader, not the GPU, explains most of its slowness).
SUSPECT_DATA_WAIT_SHARE = 0.5
# Host pressure (PSI): CPU "some" and IO "full" above these shares of the time.
SUSPECT_CPU_PRESSURE_RATIO = 0.25
SUSPECT_IO_PRESSURE_RATIO = 0.1

# Where the straggler alerts' dashboard_url points: your Grafana's base URL, and the Slurm job
# dashboard's panel that shows each rank's deviation with its suspects
# (dashboards/boards/slurm_job.py gives that panel this id).
GRAFANA_URL = "http://grafana.example.com"
SLURM_JOB_DASHBOARD_UID = "lockstep-slurm-job"
RANK_DEVIATION_PANEL_ID = 100
RANK_SUSPECTS_PANEL_ID = 101
GPU_DEVIATION_PANEL_ID = 102

# A job is stalled when none of its ranks completed a step for this long (covers a checkpoint
# save or an evaluation pass, which pause a synchronous job, of up to this long) ...
TRAINING_STALL_WINDOW = "10m"
# ... while Slurm still runs it.  The rule looks this far back for the job's last step: the
# agent drops a rank's series once it has logged nothing for its idle_timeout (10 minutes), so
# the alert reads the last value seen, not a series that must still exist.  A job hung for
# longer than this drops out of the alert (it will have been paged by then).
TRAINING_STALL_LOOKBACK = "1h"

# --- Inference KV cache ------------------------------------------------------------------------

# KV cache pressure: usage above this while requests are waiting for a slot.
KV_CACHE_USAGE_RATIO = 0.9
# Preemptions (vLLM) / retractions (SGLang) per minute, averaged over 5 minutes.
KV_PREEMPTIONS_PER_MINUTE = 1.0

# --- Inference throughput, latency and errors ----------------------------------------------

# Throughput drop: an endpoint's generation tokens per second (5-minute rate) below this share
# of its own level over the last INFERENCE_THROUGHPUT_BASELINE_WINDOW, while requests wait
# (waiting requests mean the engine is saturated: a fall in demand empties the queue instead).
# Its level is the 90th percentile of its 5-minute rates in the window: a rate it held for at
# least a tenth of the window, so a short burst does not set it, and the drop itself does not
# pull it down until it has lasted most of the window (an average would: a drop to 45 % of the
# level would never fire, diluting its own baseline within the 'for').
INFERENCE_THROUGHPUT_DROP_RATIO = 0.5
INFERENCE_THROUGHPUT_BASELINE_WINDOW = "1h"
INFERENCE_THROUGHPUT_BASELINE_QUANTILE = 0.9
# Time to first token: the p95 over 5 minutes above the SLO, in seconds, for 10 minutes.  One
# number for every endpoint (INFERENCE_TTFT_SLO_SECONDS), or per model: a model listed in
# INFERENCE_TTFT_SLO_SECONDS_BY_MODEL (the value of its `model` label, exactly) is held to its
# own SLO instead, e.g. {"meta-llama/Llama-3.1-405B-Instruct": 5.0}.  2 s: a common interactive
# chat target for p95 TTFT; batch or long-prompt endpoints need their own.
INFERENCE_TTFT_SLO_SECONDS = 2.0
INFERENCE_TTFT_SLO_SECONDS_BY_MODEL: dict[str, float] = {}
# Errors: the share of finished requests that were aborted or failed (reason abort or error),
# over 5 minutes, above this for 10 minutes ...
INFERENCE_FAILED_REQUESTS_RATIO = 0.05
# ... on an endpoint finishing at least this many requests a minute: an idle endpoint with one
# aborted request out of three is not paged.
INFERENCE_MIN_REQUESTS_PER_MINUTE = 10.0

# --- Checkpoints -------------------------------------------------------------------------------

# A save in progress for longer than this many expected intervals is stalled ...
CHECKPOINT_STALL_INTERVALS = 1.0
# ... and a root whose last completed save is older than this many intervals is overdue.
CHECKPOINT_OVERDUE_INTERVALS = 2.0
# The interval assumed for roots configured without expected_interval (docs/storage.md).
CHECKPOINT_DEFAULT_INTERVAL_SECONDS = 3600

# --- GPU health --------------------------------------------------------------------------------

# XIDs that mean the GPU needs attention (NVIDIA's XID catalogue): 48 double-bit ECC error,
# 61/62 internal micro-controller breakpoint/halt, 64 row remapping (or page retirement)
# failure, 74 NVLink error, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC error,
# 119/120 GSP RPC timeout / GSP error.  79 (fallen off the bus) is LockstepGPUFellOffBus's;
# 63 (a row remapping recorded: the GPU needs a reset, see lockstep_gpu_row_remapping_pending)
# and the application faults 13, 31, 43, 45 are not here.
CRITICAL_XIDS = (48, 61, 62, 64, 74, 92, 94, 95, 119, 120)
# XIDs after which `lockstep health-check` calls the node unhealthy until the agent restarts (a
# reboot, or `systemctl restart lockstep` after the GPU was reset): those whose resolution in
# NVIDIA's XID catalogue is a GPU reset or a reboot.  48 double-bit ECC, 61/62 micro-controller
# halt, 63 a row remapping recorded (applied at the next reset), 64 row remapping failure, 74
# NVLink error, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP timeout/error, 140
# unrecovered ECC.  Not 92 (a high single-bit rate: watch it) nor 94 (a contained ECC error: the
# application that used the memory ends, the GPU goes on).
HEALTH_RESET_XIDS = (48, 61, 62, 63, 64, 74, 79, 95, 119, 120, 140)
# NVLink errors per minute on one GPU (summed over its links, NVML's GPU-wide counters) or, on
# GPUs without those (Blackwell), on one link, averaged over 10 minutes.  Every type counts but
# Blackwell's raw symbol_errors, which forward error correction repairs (its effective_errors are
# the ones that got through).
NVLINK_ERRORS_PER_MINUTE = 1.0
NVLINK_IGNORED_ERROR_TYPES = ("symbol_errors",)
# The per-link counters of GPUs that have no GPU-wide ones (Blackwell's; see
# lockstep_nvlink_errors_total).  Only these are read per link: the DL counters up to Hopper
# (replay, recovery, crc_flit) are judged by their GPU-wide sums, 32 series a node instead of
# 432 (docs/performance.md: the per-link rule took 66 s per evaluation at 1,024 nodes).
NVLINK_PER_LINK_ONLY_ERROR_TYPES = (
    "effective_errors",
    "link_recovery_successful",
    "link_recovery_failed",
    "receive_errors",
    "transmit_discards",
    "malformed_packets",
    "buffer_overruns",
    "local_link_integrity_errors",
)
# Throttling is judged by its share of time (the rate of lockstep_gpu_clock_event_seconds_total
# over this window), not by the flag at each evaluation: a GPU hovering at its limit flickers
# in and out of it.  A 30-second blip is 10 % of the window, a GPU held down a quarter of the
# time or more is reported.
GPU_THROTTLE_TIME_RATIO = 0.25
GPU_THROTTLE_WINDOW = "5m"
# GPU core temperature drawn as the warning line on dashboards (the alerts use the driver's own
# thermal slowdown reasons, not a temperature).
GPU_TEMPERATURE_WARNING_CELSIUS = 85

# A GPU held by a Slurm job or a Kubernetes pod is idle while its SM activity (GPM, Hopper and
# newer: the share of SM cycles with a warp on the SM), or without GPM its utilization, averaged
# over 5 minutes, stays below this share ...
GPU_IDLE_ACTIVITY_RATIO = 0.01
# ... for this long (a job's setup, a checkpoint save or an evaluation pause is shorter).
GPU_IDLE_FOR = "1h"
# The driver asks for a GPU reset, drain or reboot (lockstep_gpu_recovery_action other than
# none) for this long: a moment's value during a reset is no page.
GPU_RECOVERY_ACTION_FOR = "2m"
# NVSwitch fabric health conditions that page (route_recovery and access_timeout_recovery are
# the driver repairing itself: dashboard only), and how long one (or a registration that has
# not completed) must last.
GPU_FABRIC_DEGRADED_CONDITIONS = ("degraded_bandwidth", "route_unhealthy", "registration_failed")
GPU_FABRIC_FOR = "5m"

# --- InfiniBand and RoCE -----------------------------------------------------------------------

# Link down + link error recovery events in the window that make a link flapping.
IB_LINK_FLAP_EVENTS = 2
IB_LINK_FLAP_WINDOW = "15m"
# Symbol errors per hour (ibqueryerrors' default threshold is 10 for SymbolErrorCounter).
IB_SYMBOL_ERRORS_PER_HOUR = 10
# Congestion: transmit-wait ticks as a share of (wait ticks + transmitted 4-byte words), 5 min.
IB_TRANSMIT_WAIT_RATIO = 0.1
# PFC storm: share of time an interface spends sending pause (pausing its switch port).
PFC_TX_PAUSE_RATIO = 0.2
# CNPs ignored per second: congestion notifications arrive and nobody slows down.
ROCE_CNP_IGNORED_PER_SECOND = 1.0

# --- PCIe links -------------------------------------------------------------------------------

# A GPU's or HCA's PCIe link below its maximum width or generation (the maximum the device and
# its slot can do together) for this long: a link retrains in milliseconds, so a link still down
# after 10 minutes trained down and stays there until the device is reset or reseated.
PCIE_DEGRADED_FOR = "10m"
# A GPU's link is judged only while the GPU is at least this busy.  NVML lowers an idle GPU's link
# generation (and may lower its width) to save power and raises it again under load, so an idle
# GPU at Gen1 is not degraded; a busy one is at its trained maximum.  (Half busy, as for the GPU
# straggler rules; a GPU without a utilization value, e.g. in MIG mode, is not judged.)
PCIE_GPU_BUSY_UTILIZATION = 0.5
# Which devices of the pcie collector (its kind label) the alert judges: the RDMA HCAs, whose
# links carry GPUDirect RDMA.  Add "nvme" to be told about local drives too.
PCIE_ALERT_KINDS = ("infiniband",)

# --- Storage and host --------------------------------------------------------------------------

# Filesystem almost full: less than this share available ...
FILESYSTEM_AVAILABLE_CRITICAL_RATIO = 0.05
# ... or less than this share and, at the rate of the last 6 hours, full within a day.
FILESYSTEM_AVAILABLE_PREDICT_RATIO = 0.15
FILESYSTEM_PREDICT_WINDOW = "6h"
FILESYSTEM_PREDICT_HORIZON_SECONDS = 24 * 3600
# Shared filesystems (one alert per cluster and mountpoint, not one per node mounting them).
SHARED_FSTYPES = "nfs|nfs4|lustre|cifs|smb3|ceph|glusterfs|gpfs|beegfs|fuse[.].*"
# I/O stall: share of time in which every non-idle task waited for I/O (PSI "full").
IO_FULL_PRESSURE_RATIO = 0.3

# --- NCCL (issue 27: NCCL Inspector and RAS) ----------------------------------------------------

# A rank of a communicator is the collective straggler when its peers lose more than this share
# of their collective time waiting for it: 1 - (its time per collective) / (the communicator's
# median).  The rank every other rank waits for has the shortest time (it arrives last and only
# transfers); healthy ranks differ by a few percent, ranks that arrive last in turn average out.
NCCL_STRAGGLER_WAIT_SHARE = 0.2
NCCL_STRAGGLER_FOR = "10m"
# A communicator whose furthest rank launched no collective for this long, having launched some
# before, hangs (RAS collective counts).  Long above a training step, an evaluation pass or a
# synchronous checkpoint save without collectives.
NCCL_HANG_WINDOW = "15m"
NCCL_HANG_FOR = "2m"
# Dead ranks (RAS: a process unreachable for 60 s) for this long.
NCCL_DEAD_RANKS_FOR = "2m"

# --- Hangs named before the job's own watchdog ends it (issue 35) -------------------------------

# PyTorch's ProcessGroupNCCL aborts a job whose collective has not completed in 10 minutes
# (kProcessGroupNCCLDefaultTimeout; Megatron-LM's distributed_timeout_minutes is 10 too), and sites
# that raise it burn every GPU of a hung job until it fires: a hang is to be named within 5
# minutes of the stop.  No step (step logs) or no collective launched (RAS) for this long ...
HANG_WINDOW = "2m"
# ... and the evidence held for this long: 2m + 1m, plus a RAS query (30 s), a scrape (15 s) and
# an evaluation, is under 4 minutes from the stop.
HANG_FOR = "1m"
# The step-log alert looks this far back (before the window) for the job's last step: a rank
# series the agent dropped is still seen, and a job that ended this long ago is forgotten.
HANG_STEPS_LOOKBACK = "10m"
# A GPU spins (an NCCL kernel polling for a peer that never comes) when a kernel runs at every
# sample of the window (utilization at least this) ...
GPU_SPIN_UTILIZATION = 0.95
# ... at near-idle power: below this share of its power limit at every sample.  An H100 (700 W
# limit) idles at ~70 W and spins in NCCL at ~100-200 W; training and evaluation draw 50-90 % of
# the limit.  A GPU of the job at or above it at any sample of the window does real work (an
# evaluation, a slow rank computing): the job is not hung.
GPU_SPIN_POWER_RATIO = 0.35
# A hung job that ended (PyTorch's watchdog, scancel) is recorded when its hang alert fired within
# this window before the job's series went: long enough for the job's end to reach every series
# (a scrape, a RAS round, Slurm's cgroup removal), short enough that a job that recovered from
# a hang and ended normally later is not recorded as ended hung.
HANG_ENDED_WITHIN = "5m"

# --- Training frameworks' own output (framework_logs collector, issue 37) ------------------------

# A job seen through its framework's output is stalled when it has printed no step report for
# TRAINING_STALL_WINDOW and for FRAMEWORK_STALL_REPORTS times its usual time between reports
# (Megatron reports every log_interval = 100 iterations: minutes apart for slow steps), over the
# hour before (FRAMEWORK_REPORTS_WINDOW).
FRAMEWORK_STALL_REPORTS = 3
FRAMEWORK_REPORTS_WINDOW = "1h"
# For the hang alert (HANG_WINDOW, with the GPUs' evidence): no report for HANG_WINDOW and for
# FRAMEWORK_HANG_REPORTS times the usual time between reports.
FRAMEWORK_HANG_REPORTS = 2
# A slowdown: the job's time per iteration over FRAMEWORK_SLOWDOWN_RECENT is this much above its
# own level over the FRAMEWORK_SLOWDOWN_BASELINE before it (a synchronous job slows as a whole: its
# slowest rank, link or disk).
FRAMEWORK_SLOWDOWN_RATIO = 1.25
FRAMEWORK_SLOWDOWN_RECENT = "15m"
FRAMEWORK_SLOWDOWN_BASELINE = "1h"
FRAMEWORK_SLOWDOWN_FOR = "10m"


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("10m", "2h", "30s") in seconds: the windows above
    where the report judges in Python what the rules judge in PromQL."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]


# --- `lockstep health-check` (docs/health-check.md) --------------------------------------------

# The whole check's deadline: slurmd kills a HealthCheckProgram after 60 s, node-problem-detector
# after its rule's timeout (deploy/node-problem-detector/: 30 s).  Past it the answer is unknown.
HEALTH_CHECK_SECONDS = 20.0
# The most of it spent waiting for the local agent's /metrics, so that a round of the collectors
# in the check's own process still fits when the agent does not answer.
HEALTH_AGENT_SECONDS = 5.0
# An answer longer than this is not read (a node's exposition is 0.3-2 MB).
HEALTH_MAX_EXPOSITION_MIB = 32
# The logical state of an InfiniBand port that carries traffic (4 ACTIVE) and the physical state
# of one an administrator disabled (3 Disabled: not a fault).
IB_PORT_ACTIVE = 4
IB_PORT_PHYSICAL_DISABLED = 3
# The one line printed: node-problem-detector shows the first 80 bytes (max_output_length in its
# examples), NHC and `sinfo -R` about as many.
HEALTH_REASON_CHARACTERS = 80
# What `--drain` puts before the reason, and the mark of a drain that is Lockstep's own: a node
# drained with any other reason was drained by someone else and is left alone.
HEALTH_DRAIN_PREFIX = "lockstep: "


# --- `lockstep report` (lockstep/report/prometheus.py, docs/report.md) --------------------------

# The whole report's deadline (`--timeout`), and the largest answer it reads (`--max-answer`).
REPORT_SECONDS = 60.0
REPORT_MAX_ANSWER_MIB = 64


# --- A node's record across jobs (alerts/nodes.py, docs/alerting.md) ---------------------------

# The alerts that name a node as what hurt a job: they carry the job's job_id and the instance of
# the node whose rank straggled, stopped first or hung (tests/alerts: every one carries both).
NODE_RECORD_ALERTS = (
    "LockstepTrainingStraggler",
    "LockstepTrainingStragglerSustained",
    "LockstepTrainingSlowerThanPeers",
    "LockstepGPUStraggler",
    "LockstepGPUStragglerSustained",
    "LockstepNCCLStraggler",
    "LockstepTrainingHung",
    "LockstepNCCLRankStuck",
    "LockstepJobEndedHung",
)
# A checkpoint stall names its slow writer in the node's record: the node whose agent saw the
# job's save stall (LockstepCheckpointStalled, its root's job_id from lockstep_checkpoint_info)
# where the root is on the node's own storage (lockstep_checkpoint_info's storage="local": other
# nodes' roots of the same path are their own), where it alone saw it (a shared root only its
# agent watches), or where its own storage showed one of these node suspects then
# (lockstep/suspects.py): on a shared root every watching agent sees the same save stall, and the
# node whose mount hangs or whose I/O stalls is the one holding it up.  The record of it, one
# series a (node, job) while it stalls.
NODE_CHECKPOINT_WRITER_SUSPECTS = ("hung_mount", "io_pressure")
NODE_CHECKPOINT_WRITER_RECORD = "instance_job:lockstep_checkpoint_stall_writer:active"
# How far back a node's record reaches, and the record's name (the rules write it; the health
# check reads it).
NODE_RECORD_WINDOW = "7d"
NODE_JOBS_HURT_RECORD = "instance:lockstep_jobs_hurt:count7d"
# Distinct jobs a node hurt in NODE_RECORD_WINDOW that make it a repeat offender (a "lemon"): by
# chance, with a fleet's alerts falling on its nodes at random, a node is named in a job's alert
# at rate r = (jobs named a week) / (nodes); three or more in a week has probability
# 1 - e^-r (1 + r + r^2/2), 2e-5 a node at r = 0.05 (50 named jobs a week over 1,000 nodes): 0.02
# nodes flagged a week by chance.  A fleet with r near 0.5 flags 1.4 % of its nodes by chance:
# raise it (docs/alerting.md).
NODE_JOBS_HURT = 3
# The alerts that say a node's hardware needs a repair or a reset before it runs jobs again: the
# health check's GPU verdicts as alerts (lockstep/health/verdicts.py: a GPU lost, NVML's recovery
# action, an XID that needs a reset, a failed row remapping).  Any of them firing on a node fires
# LockstepNodeNeedsRepair, and Alertmanager sends them and it as one page per node
# (alerts/alertmanager.yml).  A port down is not among them: behind a leaf switch it is down on
# every node at once, and the fabric's one page per cluster says so (the health check still
# drains for it, node by node).
NODE_REPAIR_ALERTS = (
    "LockstepGPUFellOffBus",
    "LockstepGPURecoveryActionRequired",
    "LockstepGPUXidCritical",
    "LockstepGPURowRemapFailure",
)
