"""The simulated node's workloads: job 4242's per-rank training logs, and in the
``kv-pressure`` scenario a vLLM server running out of KV cache.

Training (every scenario): job 4242 of user alice has 16 ranks, 8 per node; ranks 0-7
run here on node001 (local rank i on GPU i), ranks 8-15 on node002.  The job's run
directory is on a shared file system, so this node sees all 16 logs under
``/scratch/runs/llama-70b__job=4242__task=N/logs/rank-NNN.metrics.jsonl`` (rootfs).
node001's ranks write with lockstep/emitter.py (explicit compute and
communication-wait times, tokens, samples); node002's ranks write the older record set
(step_time_sec, data_time_sec, allreduce_time_pct, throughput_examples_per_sec), from
which the collector derives the same quantities.  The job started 300 s before the demo.

``straggler``: from 120 s before the demo, rank 3 (GPU 3, which the GPU area throttles)
computes slower, reaching 1.4x its peers' compute time 60 s later.  Every rank's step
takes as long as the slowest rank's compute plus data and transfer time, so all wall
step times stay equal while the peers' communication wait grows.

``kv-pressure``: a vLLM server, pid 3100 (``vllm serve ... --port 8000``) with its engine
core 3101, listens on 0.0.0.0:8000; the inference collector finds it from procfs and
scrapes http://127.0.0.1:8000/metrics, answered through the seam ``INFERENCE_HTTP``.
Its KV-cache usage climbs towards 0.97 (0.949 at the demo's start), with preemptions and
a growing queue.
``kubernetes``: the same server, calm (KV cache at 42 %, nothing waiting or preempted), as the
``inference`` pod's ``vllm`` container.
``inference-slow``, ``inference-errors``, ``inference-quiet``: the same server, calm (p95 time
to first token ~0.5 s, 12 requests and 2,400 tokens a second, 1 % aborted) until
INFERENCE_ONSET (30 s), then slowed (30 % of its tokens a second, a growing queue, p95 time to
first token ~9 s), failing (8 % aborted, 12 % failed), or quiet (demand falls to 6 requests a
minute, 40 % of them aborted, nothing waits: a near miss).  Each phase's traffic (PHASES) adds
to the counters and histograms from its start.

Logs are appended to (never replaced, which the collector would take for a rotation),
and their content is a pure function of (scenario, t).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lockstep.collectors.inference.fetch import INFERENCE_HTTP
from lockstep.emitter import format_timestamp, step_lines
from lockstep.simulation import Scenario, kubernetes
from lockstep.simulation.host import BOOT_TIME
from lockstep.simulation.slurm import TRAINING_PID
from lockstep.simulation.timeline import (
    DATA_SCENARIOS,
    FRAMEWORK_ONLY,
    HANG_AT,
    HANG_NCCL,
    HANG_STEP_LOGS,
    INFERENCE_SCENARIOS,
    PAUSE,
    SKEW,
    SKEWED_SCENARIOS,
    SLOW_FACTOR,
    hang_phase,
    slow,
)

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "kv-pressure",
        "A vLLM server on the node runs out of KV cache: usage climbs to ~0.97, requests are "
        "preempted and the queue grows.",
    ),
    Scenario(
        "inference-slow",
        "30 s in, the node's vLLM server generates 30 % of the tokens a second it did, requests queue and "
        "the p95 time to first token rises to ~9 s.",
    ),
    Scenario(
        "inference-errors",
        "30 s in, the node's vLLM server aborts 8 % of its requests and fails 12 %.",
    ),
    Scenario(
        "inference-quiet",
        "30 s in, demand on the node's vLLM server falls to 6 requests a minute (tokens a second fall to 1 %, "
        "nothing waits), and 40 % of those few are aborted: a near miss that fires nothing.",
    ),
    Scenario(
        "slow-rank",
        "25 minutes in, job 4242's rank 3 turns 10 % slower for no visible reason (LockstepTrainingStraggler"
        "Sustained names no suspect); the healthy job jitters, has per-rank biases, evaluation passes and "
        "checkpoint pauses.",
        starts_healthy=True,
    ),
    Scenario(
        "slow-rank-skewed",
        "As slow-rank, but node001's ranks start each step 0.7 s after the one before (launch skew): rank 7 "
        "arrives last at every all-reduce and nothing waits for rank 3. LockstepTrainingSlowerThanPeers names "
        "rank 3; LockstepTrainingStragglerSustained (the rank the job waits for) names no one.",
    ),
    Scenario(
        "straggler-thermal",
        "25 minutes in, GPU 3 is held down by thermal slowdown (SM clock -10 %) and rank 3 turns 10 % slower.",
        starts_healthy=True,
    ),
    Scenario(
        "straggler-pfc",
        "25 minutes in, ens3f0np0 storms PFC pause and rank 3 (whose pipeline sends cross it) turns 10 % slower.",
        starts_healthy=True,
    ),
    Scenario(
        "straggler-data",
        "25 minutes in, rank 3's data loader starves: its data wait grows and it turns 10 % slower.",
        starts_healthy=True,
    ),
    Scenario(
        "straggler-nfs",
        "25 minutes in, /home (NFS) hangs; rank 3 reads its data from it and turns 10 % slower.",
        starts_healthy=True,
    ),
    Scenario(
        "training-hang",
        "Job 4242 hangs in a collective: no rank has logged a step for 9.5 minutes, and Slurm still runs the job.",
    ),
    Scenario(
        "training-finished",
        "Job 4242 ended normally 9.5 minutes ago: its ranks stopped logging and Slurm no longer runs it.",
    ),
    # Issue 35's hangs and their twins (simulation/timeline.py has the story; the GPU, NCCL,
    # storage and Slurm areas follow it).
    Scenario(
        "hang-steps",
        "A minute in, job 4242 (step logs, no NCCL telemetry) hangs: rank 6 stops before the AllReduce, its GPU 6 "
        "idles, the other ranks wait and their GPUs spin; no step completes.",
        starts_healthy=True,
    ),
    Scenario(
        "hang-nccl",
        "A minute in, job 4242 (NCCL Inspector and RAS, no step logs) hangs: rank 6 (GPU 6) stops one AllReduce "
        "behind the other 15, which wait in it and spin; RAS counts stop.",
    ),
    Scenario(
        "hang-killed",
        "hang-nccl, and 10 minutes after the stop PyTorch's watchdog ends the job: RAS, Slurm and the GPUs forget it.",
    ),
    Scenario(
        "hang-save",
        "A minute in, job 4242 saves a checkpoint synchronously for 6 minutes: rank 0 writes, the others wait in a "
        "collective and spin, RAS counts stop with rank 0 behind (a near miss: no alert).",
    ),
    Scenario(
        "hang-eval",
        "A minute in, job 4242 evaluates for 6 minutes: no step, no collective, every GPU at work (a near miss: "
        "no alert).",
    ),
    Scenario(
        "hang-end",
        "A minute in, job 4242 ends normally: no step, its GPUs idle, RAS and Slurm forget it (a near miss: no alert).",
    ),
    Scenario(
        "straggler",
        "Job 4242's rank 3 (on GPU 3, throttled) computes 1.4x as long as its 15 peers, whose "
        "communication wait grows; every rank's wall step time is the same.",
    ),
)

DEMO_EPOCH = BOOT_TIME + 86_400  # Unix time at t=0: the node has been up a day
JOB_ID = "4242"
RANKS = 16
RANKS_PER_NODE = 8
HOSTS = ("node001", "node002")
STRAGGLER_RANK = 3
JOB_START = -300.0  # seconds relative to t=0
# training-hang and training-finished: the job ran from HUNG_JOB_START and no rank completes a
# step after STOP_AT, 9.5 minutes before the demo ("no step for 10 minutes" 30 s into it).
HUNG_JOB_START, STOP_AT = -720.0, -570.0
STRAGGLER_ONSET = -120.0
STRAGGLER_RAMP = 60.0
STRAGGLER_FACTOR = 1.4
# A healthy step of the 70B model: 16 s wall.  (Long steps also keep the logs small when the
# demo runs an hour of simulated time in a minute, --speed 60.)
DATA_WAIT, COMPUTE, TRANSFER = 1.0, 13.0, 2.0
TOKENS_PER_STEP, SAMPLES_PER_STEP = 327680, 80
LOG_GLOB = "/scratch/runs/*__job=*/logs/rank-*.metrics.jsonl"

VLLM_PID, VLLM_ENGINE_CORE_PID, VLLM_PORT, VLLM_SOCKET_INODE = 3100, 3101, 8000, 48100
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
VLLM_KV_TOKENS = 65_536  # the KV cache of the simulated engine, in tokens (4,096 blocks of 16)
VLLM_URL = f"http://127.0.0.1:{VLLM_PORT}/metrics"
PRESSURE_ONSET = -120.0  # the KV-cache episode began two minutes before the demo
# The inference scenarios: a calm server whose fault begins at INFERENCE_ONSET, early in the
# demo so the end-to-end test sees its alerts well within its deadline, yet after half a minute
# of calm that LockstepInferenceThroughputDrop compares with (the test's Prometheus scrapes each
# demo from its start; its compressed level window, 6 minutes, holds what there is).
INFERENCE_ONSET = 30.0
SERVER_START = -3600.0  # their server has served an hour when the demo starts
# Where a vLLM server runs: under KV-cache pressure, (kubernetes) calm in the inference pod, and
# the inference scenarios.
VLLM_SCENARIOS = ("kv-pressure", "kubernetes", *INFERENCE_SCENARIOS)
HEALTHY_KV_CACHE_USAGE = 0.42

# Steps of the job so far, per scenario: (start, end) relative to t=0.
_timelines: dict[str, list[tuple[float, float]]] = {}
# Per log file: (steps written, file size then), to append instead of rewriting.
_written: dict[str, tuple[int, int]] = {}


def build(node: SimulatedNode, t: float) -> None:
    node.options["training"] = {"logs": [LOG_GLOB], "start_at": "beginning", "node_name": HOSTS[0]}
    _training_logs(node, t)
    if node.scenario in VLLM_SCENARIOS:
        _vllm_process(node)
        endpoints = node.seams.get(INFERENCE_HTTP)
        if not isinstance(endpoints, SimulatedEndpoints):  # one for the node's life, like every seam
            endpoints = SimulatedEndpoints()
            node.seams.replace(INFERENCE_HTTP.replaced_by(endpoints))
        endpoints.pages = {VLLM_URL: vllm_exposition(t, node.scenario)}


# --- training ---


def straggler_factor(scenario: str, start: float) -> float:
    if scenario != "straggler":
        return 1.0
    progress = min(1.0, max(0.0, (start - STRAGGLER_ONSET) / STRAGGLER_RAMP))
    return 1.0 + (STRAGGLER_FACTOR - 1.0) * progress


# --- Healthy variation of a real job (issue 19; issue 17 makes the node's healthy data realistic
# in general: reconcile there).  Every rank differs from step to step by up to STEP_JITTER and
# has a stable speed of its own (RANK_BIAS); every EVAL_EVERY seconds the job runs an evaluation
# pass in which every rank's steps take EVAL_SLOWDOWN times as long, and every CHECKPOINT_EVERY
# seconds it stops for a synchronous checkpoint save.  All are pure functions of (rank, step).

STEP_JITTER = 0.03
RANK_BIAS_SPREAD = 0.02
EVAL_EVERY, EVAL_LENGTH, EVAL_SLOWDOWN = 600.0, 60.0, 1.3
CHECKPOINT_EVERY, CHECKPOINT_PAUSE = 900.0, 40.0


def _unit(*key: object) -> float:
    """A deterministic pseudo-random number in [-1, 1) for the key."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**31 - 1.0


RANK_BIAS = tuple(1.0 + RANK_BIAS_SPREAD * _unit("bias", rank) for rank in range(RANKS))


def healthy_compute_factor(rank: int, step: int, start: float) -> float:
    evaluating = (start - JOB_START) % EVAL_EVERY >= EVAL_EVERY - EVAL_LENGTH
    return RANK_BIAS[rank] * (1.0 + STEP_JITTER * _unit("step", rank, step)) * (EVAL_SLOWDOWN if evaluating else 1.0)


def checkpoint_pause(previous: tuple[float, float]) -> float:
    """The pause after a step (start, end): a checkpoint save when the step crossed a save time."""
    start, end = previous
    crossed = (start - JOB_START) // CHECKPOINT_EVERY != (end - JOB_START) // CHECKPOINT_EVERY
    return CHECKPOINT_PAUSE if crossed else 0.0


# --- Faults of the straggler scenarios that name a suspect: rank 3 turns ~10 % slower at
# SLOW_ONSET, after 25 minutes of healthy history to compare it against.

SLOW_RANK = STRAGGLER_RANK


def rank_times(scenario: str, rank: int, step: int, start: float) -> tuple[float, float]:
    """(data wait, compute) of one rank's step."""
    compute = COMPUTE * healthy_compute_factor(rank, step, start)
    data = DATA_WAIT
    if rank == STRAGGLER_RANK:
        compute *= straggler_factor(scenario, start)
    if rank == SLOW_RANK and slow(scenario, start):
        excess = (SLOW_FACTOR - 1.0) * (DATA_WAIT + COMPUTE * RANK_BIAS[rank])
        if scenario in DATA_SCENARIOS:
            data += excess
        else:
            compute += excess
    return data, compute


def start_offset(scenario: str, rank: int) -> float:
    """How long after the step's start the rank starts it: SKEW per rank on node001 in the skewed
    scenarios (node002's ranks log no compute time, so a wait of theirs outside every phase would
    read as compute), 0 elsewhere."""
    if scenario in SKEWED_SCENARIOS and rank < RANKS_PER_NODE:
        return rank * SKEW
    return 0.0


def arrival(scenario: str, rank: int, step: int, start: float) -> float:
    """When, after the step's start, the rank is at the step's all-reduce."""
    return start_offset(scenario, rank) + sum(rank_times(scenario, rank, step, start))


def timeline(scenario: str, t: float) -> list[tuple[float, float]]:
    """The job's finished steps by time t: (start, end) each.  Every rank's step ends when the
    slowest rank's data and compute are done and the transfer after them."""
    steps = _timelines.setdefault(scenario, [])
    stopped = scenario in ("training-hang", "training-finished")
    while True:
        start = steps[-1][1] + checkpoint_pause(steps[-1]) if steps else HUNG_JOB_START if stopped else JOB_START
        if scenario == "gpu-lost" and start >= 0.0:
            break  # GPU 5 fell off the bus at t=0: rank 5 never finishes a step, every rank waits in NCCL
        index = len(steps)
        slowest = max(arrival(scenario, rank, index, start) for rank in range(RANKS))
        end = round(start + slowest + TRANSFER, 6)
        if scenario in HANG_PAUSES and end > HANG_AT and start < HANG_AT + PAUSE:
            start = HANG_AT + PAUSE  # a save or an evaluation: the next step begins after it
            slowest = max(arrival(scenario, rank, index, start) for rank in range(RANKS))
            end = round(start + slowest + TRANSFER, 6)
        if end > t or (stopped and end > STOP_AT) or (scenario in HANG_STOPS and end > HANG_AT):
            break
        steps.append((start, end))
    return [step for step in steps if step[1] <= t]


# Issue 35: where job 4242 stops at HANG_AT for good (a hang, its end), and where it pauses for PAUSE.
HANG_STOPS = ("hang-steps", "hang-nccl", "hang-killed", "hang-end")
HANG_PAUSES = ("hang-save", "hang-eval")


def rank_step_text(scenario: str, rank: int, step: int, start: float, end: float) -> str:
    data_wait, compute = rank_times(scenario, rank, step, start)
    wall = end - start
    comm_wait = wall - start_offset(scenario, rank) - data_wait - compute
    host = HOSTS[rank // RANKS_PER_NODE]
    if host == HOSTS[0]:
        return step_lines(
            job_id=JOB_ID,
            rank=rank,
            host=host,
            step=step,
            ts=DEMO_EPOCH + end,
            step_time=wall,
            compute_time=compute,
            comm_wait_time=comm_wait,
            data_time=data_wait,
            tokens=TOKENS_PER_STEP,
            samples=SAMPLES_PER_STEP,
        )
    # node002: the older record set, no step number (steps are told apart by ts).
    stamp = format_timestamp(DEMO_EPOCH + end)
    values = (
        ("step_time_sec", round(wall, 6), "s"),
        ("data_time_sec", round(data_wait, 6), "s"),
        ("allreduce_time_pct", round(comm_wait / wall * 100, 4), "%"),
        ("throughput_examples_per_sec", round(SAMPLES_PER_STEP / wall, 4), "examples/s"),
        ("gpu_utilization_pct", 97.0, "%"),
    )
    return "".join(
        json.dumps(
            {"ts": stamp, "job_id": JOB_ID, "rank": rank, "host": host, "metric": m, "value": v, "unit": u},
            separators=(",", ":"),
        )
        + "\n"
        for m, v, u in values
    )


def log_path(node: SimulatedNode, rank: int) -> Path:
    task = rank // RANKS_PER_NODE
    run = f"llama-70b__job={JOB_ID}__task={task}"
    return node.paths.rootfs / "scratch" / "runs" / run / "logs" / f"rank-{rank:03d}.metrics.jsonl"


def _training_logs(node: SimulatedNode, t: float) -> None:
    if node.scenario in HANG_NCCL and node.scenario not in HANG_STEP_LOGS:
        return  # a job seen through NCCL's telemetry alone: it writes no step logs
    if node.scenario in FRAMEWORK_ONLY:
        return  # a job seen through its framework's output alone (framework_logs.py)
    steps = timeline(node.scenario, t)
    for rank in range(RANKS):
        path = log_path(node, rank)
        written, size = _written.get(str(path), (0, -1))
        if not path.exists() or path.stat().st_size != size or written > len(steps):
            text = "".join(rank_step_text(node.scenario, rank, k, *steps[k]) for k in range(len(steps)))
            node.write(path, text)
        else:
            text = "".join(rank_step_text(node.scenario, rank, k, *steps[k]) for k in range(written, len(steps)))
            with open(path, "a") as log:
                log.write(text)
        _written[str(path)] = (len(steps), path.stat().st_size)
    _rank_processes(node, t)


# The descriptor numbers of node001's rank logs in their process (fd 20 holds rank 0's log).
FIRST_LOG_FD = 20
# O_WRONLY | O_APPEND | O_LARGEFILE, in octal as /proc/PID/fdinfo shows a log opened for appending.
APPEND_FLAGS = "0102001"


def _rank_processes(node: SimulatedNode, t: float) -> None:
    """node001's ranks hold their logs open while the job runs (hung included), as their
    processes do (lockstep.emitter's StepLog, logging.FileHandler): a descriptor on each local
    log in the simulated procfs, its path and its flags and inode as the training collector's
    writer count reads them (collectors/training/writers.py).  One process (the job's task,
    TRAINING_PID) stands for the node's 8 rank processes: each log has one writer either way.
    node002's ranks run on node002, where no process of this node holds their logs.  Once the
    job has ended its descriptors are gone: the kernel closed them when its processes exited."""
    process = node.paths.procfs / str(TRAINING_PID)
    ended = node.scenario == "training-finished" or hang_phase(node.scenario, t) == "ended"
    write = node.write_if_changed
    for rank in range(RANKS_PER_NODE):
        fd = process / "fd" / str(FIRST_LOG_FD + rank)
        info = process / "fdinfo" / str(FIRST_LOG_FD + rank)
        path = log_path(node, rank)
        if ended or not path.exists():
            fd.unlink(missing_ok=True)
            info.unlink(missing_ok=True)
            continue
        if not fd.is_symlink():
            fd.parent.mkdir(parents=True, exist_ok=True)
            # The path as the process names it, in its own mount namespace: the host's, not rootfs'.
            os.symlink("/" + str(path.relative_to(node.paths.rootfs)), fd)
        # (Its position left at 0: nothing reads it, and so the file changes only with the log's inode.)
        write(info, f"pos:\t0\nflags:\t{APPEND_FLAGS}\nmnt_id:\t31\nino:\t{path.stat().st_ino}\n")


# --- inference ---


class SimulatedEndpoints:
    """Stands in for HTTP: URL -> the exposition text the engine would answer with."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}

    def __call__(self, url: str, timeout: float) -> str:
        if url not in self.pages:
            raise ConnectionRefusedError(f"nothing listens at {url} on the simulated node")
        return self.pages[url]


def _vllm_process(node: SimulatedNode) -> None:
    proc = node.paths.procfs
    pid_cgroup = kubernetes.pid_cgroup if node.scenario == "kubernetes" else lambda pid: None
    processes = {
        VLLM_PID: ("vllm", 1, ["vllm", "serve", VLLM_MODEL, "--port", str(VLLM_PORT)]),
        VLLM_ENGINE_CORE_PID: ("VLLM::EngineCor", VLLM_PID, ["VLLM::EngineCore"]),
    }
    for pid, (comm, ppid, argv) in processes.items():
        stat = f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100\n"
        node.write(proc / str(pid) / "stat", stat)
        node.write(proc / str(pid) / "task" / str(pid) / "stat", stat)
        node.write(proc / str(pid) / "cmdline", "\0".join(argv) + "\0")
        # Under Kubernetes the server is the inference pod's vllm container (simulation/kubernetes.py).
        node.write(proc / str(pid) / "cgroup", pid_cgroup(pid) or "0::/system.slice/vllm.service\n")
    fd = proc / str(VLLM_PID) / "fd" / "17"
    if not fd.is_symlink():
        fd.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(f"socket:[{VLLM_SOCKET_INODE}]", fd)
    # 0.0.0.0:8000 (1F40) listening (0A), owned by the socket above.
    node.write(
        proc / str(VLLM_PID) / "net" / "tcp",
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        f"   0: 00000000:{VLLM_PORT:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
        f"{VLLM_SOCKET_INODE} 1 0000000000000000 100 0 0 10 0\n",
    )


def kv_cache_usage(t: float) -> float:
    return 0.55 + 0.42 * (1 - math.exp(-(t - PRESSURE_ONSET) / 40.0))


_TTFT_BOUNDS = ("0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0")
_TTFT_CDF = (0.02, 0.05, 0.09, 0.14, 0.2, 0.35, 0.5, 0.62, 0.7, 0.86, 0.95, 0.98, 0.995)
_ITL_BOUNDS = ("0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75", "1.0", "2.5")
_E2E_BOUNDS = ("1.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0", "60.0", "120.0")
_E2E_CDF = (0.02, 0.08, 0.25, 0.55, 0.75, 0.86, 0.94, 0.97, 0.985, 0.995, 1.0)
_ITL_CDF = (0.05, 0.3, 0.6, 0.75, 0.85, 0.92, 0.96, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0)
_TTFT_CALM_CDF = (0.05, 0.15, 0.3, 0.45, 0.6, 0.85, 0.95, 0.98, 0.99, 0.998, 1.0, 1.0, 1.0)
_TTFT_SLOW_CDF = (0.0, 0.0, 0.01, 0.02, 0.03, 0.06, 0.1, 0.15, 0.2, 0.4, 0.7, 0.9, 0.97)
_TTFT_IDLE_CDF = (0.3, 0.7, 0.9, 0.97, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Traffic:
    """What the simulated vLLM server does during one phase: per second, and its latencies."""

    requests: float  # finished a second
    tokens: float  # generated a second
    ttft_cdf: tuple[float, ...]  # over _TTFT_BOUNDS (queue time follows the same shape)
    mean_ttft: float
    aborted: float = 0.01  # shares of the finished requests
    errored: float = 0.0
    length: float = 0.1
    running: int = 48


# Requests wait for a KV-cache slot (kv-pressure): time to first token p95 ~5 s.
QUEUED = Traffic(12.0, 2400.0, _TTFT_CDF, 1.2)
# A calm server: p95 time to first token ~0.5 s.
CALM = Traffic(12.0, 2400.0, _TTFT_CALM_CDF, 0.3)
# inference-slow: generation at 30 % of its level, requests queue, p95 time to first token ~9 s.
SLOWED = Traffic(3.6, 720.0, _TTFT_SLOW_CDF, 6.5)
# inference-errors: 8 % of the requests aborted, 12 % failed.
FAILING = Traffic(12.0, 2400.0, _TTFT_CALM_CDF, 0.3, aborted=0.08, errored=0.12)
# inference-quiet: demand fell to 6 requests a minute, 40 % of them aborted by their clients.
QUIET = Traffic(0.1, 20.0, _TTFT_IDLE_CDF, 0.04, aborted=0.4, running=1)

# Each server's phases: (from time t, traffic), the first from when its counters started.
PHASES = {
    "kv-pressure": ((PRESSURE_ONSET, QUEUED),),
    "kubernetes": ((PRESSURE_ONSET, CALM),),
    "inference-slow": ((SERVER_START, CALM), (INFERENCE_ONSET, SLOWED)),
    "inference-errors": ((SERVER_START, CALM), (INFERENCE_ONSET, FAILING)),
    "inference-quiet": ((SERVER_START, CALM), (INFERENCE_ONSET, QUIET)),
}


def _per_phase(scenario: str, t: float) -> list[tuple[Traffic, float]]:
    """(traffic, seconds of it) of each phase begun by time t."""
    phases = PHASES[scenario]
    found = []
    for k, (begin, traffic) in enumerate(phases):
        end = min(t, phases[k + 1][0]) if k + 1 < len(phases) else t
        if end > begin:
            found.append((traffic, end - begin))
    return found


def vllm_exposition(t: float, scenario: str = "kv-pressure") -> str:
    """What vLLM's /metrics says at time t, in its own names (current vLLM, V1 engine): counters
    and histograms grow by each phase's traffic (PHASES); only kv-pressure fills its KV cache,
    queues requests and preempts them, and inference-slow queues them once slowed."""
    elapsed = t - PRESSURE_ONSET
    labels = f'engine="0",model_name="{VLLM_MODEL}"'
    created = DEMO_EPOCH - 3600.0
    phases = _per_phase(scenario, t)
    traffic = phases[-1][0]
    pressure = scenario == "kv-pressure"
    waiting = min(96, 4 + int(0.2 * elapsed)) if pressure else 0
    if traffic is SLOWED:
        waiting = min(96, 4 + int(0.2 * (t - INFERENCE_ONSET)))
    preemptions = int(max(0.0, elapsed - 30.0) * 0.8) if pressure else 0
    kv_cache = round(kv_cache_usage(t), 6) if pressure else HEALTHY_KV_CACHE_USAGE
    counts = [(phase, int(phase.requests * seconds)) for phase, seconds in phases]
    requests = 20_000 + sum(n for _, n in counts)
    finished = {"stop": 20_000 - 2_000 - 200, "length": 2_000, "abort": 200, "error": 0}
    for phase, n in counts:
        split = {"length": int(n * phase.length), "abort": int(n * phase.aborted), "error": int(n * phase.errored)}
        finished["stop"] += n - sum(split.values())
        for reason, count in split.items():
            finished[reason] += count
    queries = 1_200_000 + 750 * (requests - 20_000)  # 750 prompt tokens a request
    hits = int(queries * 0.35)
    tokens = 3_000_000 + sum(int(phase.tokens * seconds) for phase, seconds in phases)
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(traffic.running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {kv_cache}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} {float(queries)}",
        f"vllm:prefix_cache_queries_created{{{labels}}} {created}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {float(hits)}",
        f"vllm:prefix_cache_hits_created{{{labels}}} {created}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {float(preemptions)}",
        f"vllm:num_preemptions_created{{{labels}}} {created}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {float(tokens)}",
        f"vllm:generation_tokens_created{{{labels}}} {created}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {float(queries)}",
        f"vllm:prompt_tokens_created{{{labels}}} {created}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    # Of the finished requests, most stop, some reach their length limit, a few are aborted
    # (and, when failing, some fail).  vLLM counts a reason once it has happened.
    for reason, count in finished.items():
        if count or reason != "error":
            lines += [
                f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {float(count)}',
                f'vllm:request_success_created{{{labels},finished_reason="{reason}"}} {created}',
            ]
    # Histograms: (shares of each phase's observations by bucket, observations, their mean) per phase,
    # the 20,000 requests before the first phase observed as in it.
    ttft: list[tuple[tuple[float, ...], int, float]] = []
    for phase, n in [(phases[0][0], 20_000), *counts]:
        if ttft and ttft[-1][0] is phase.ttft_cdf:  # one traffic's observations are bucketed at once
            ttft[-1] = (phase.ttft_cdf, ttft[-1][1] + n, phase.mean_ttft)
        else:
            ttft.append((phase.ttft_cdf, n, phase.mean_ttft))
    queue = [(cdf, n, 0.75 * mean) for cdf, n, mean in ttft]
    e2e = [(_E2E_CDF, requests, 9.5)]
    itl = [(_ITL_CDF, tokens, 0.062)]
    for name, help_text, bounds, observed in (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BOUNDS, ttft),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BOUNDS, itl),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _E2E_BOUNDS, e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _TTFT_BOUNDS,
         queue),
    ):  # fmt: skip
        count = sum(n for _, n, _ in observed)
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for k, bound in enumerate(bounds):
            in_bucket = sum(round(n * cdf[k]) for cdf, n, _ in observed)
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(in_bucket)}')
        lines += [
            f'{name}_bucket{{{labels},le="+Inf"}} {float(count)}',
            f"{name}_count{{{labels}}} {float(count)}",
            f"{name}_sum{{{labels}}} {round(sum(n * mean for _, n, mean in observed), 3)}",
            f"{name}_created{{{labels}}} {created}",
        ]
    # The engine's configuration (cache_config_info, one per engine core), the KV connector's
    # counters vLLM makes at start (no connector here: 0), speculative decoding (an n-gram draft
    # of 2 tokens a step, 60 % accepted), the queue limit's refusals (none), and its API server's
    # HTTP answers: 12 refused with 503 while the model loaded, then one 500 per failed request.
    draft = 2 * (tokens // 3)
    lines += [
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",engine="0",kv_cache_size_tokens="{VLLM_KV_TOKENS}",'
        f'num_gpu_blocks="{VLLM_KV_TOKENS // 16}"}} 1.0',
        "# HELP vllm:external_prefix_cache_hits_total External prefix cache hits from KV connector cross-instance "
        "cache sharing, in terms of number of cached tokens.",
        "# TYPE vllm:external_prefix_cache_hits_total counter",
        f"vllm:external_prefix_cache_hits_total{{{labels}}} 0.0",
        f"vllm:external_prefix_cache_hits_created{{{labels}}} {created}",
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.",
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(draft)}",
        f"vllm:spec_decode_num_draft_tokens_created{{{labels}}} {created}",
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.",
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(int(draft * 0.6))}",
        f"vllm:spec_decode_num_accepted_tokens_created{{{labels}}} {created}",
        "# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit, by reason.",
        "# TYPE vllm:admission_rejections_total counter",
        f'vllm:admission_rejections_total{{model_name="{VLLM_MODEL}",reason="max_num_queued_reqs"}} 0.0',
        f'vllm:admission_rejections_total{{model_name="{VLLM_MODEL}",reason="max_num_queued_tokens"}} 0.0',
        "# HELP http_requests_total Total number of requests by method, status and handler.",
        "# TYPE http_requests_total counter",
        f'http_requests_total{{handler="/v1/completions",method="POST",status="2xx"}} '
        f"{float(requests - finished['error'] - finished['abort'])}",
        f'http_requests_total{{handler="/v1/completions",method="POST",status="5xx"}} {float(12 + finished["error"])}',
    ]
    lines += [
        "# HELP python_info Python platform information",
        "# TYPE python_info gauge",
        'python_info{implementation="CPython",major="3",minor="12",patchlevel="3",version="3.12.3"} 1.0',
    ]
    return "\n".join(lines) + "\n"
