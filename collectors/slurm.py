"""Slurm collector: the jobs running on this node, their CPU, memory and GPUs, and the node's state.

Where the data comes from, cheapest first:
- Jobs are found on the node itself, from their cgroups (v2 ``*slurmstepd.scope/job_*``,
  multiple-slurmd ``<node>_slurmstepd.scope``, v1 ``<controller>/slurm*/uid_*/job_*``); on
  nodes without job cgroups (proctrack/linuxproc) from ``scontrol listpids``, which asks the
  local slurmd only.  CPU, memory and OOM kills come from the same cgroups.
- A job's user, account, partition, name, array ids and GPU indices come from its processes'
  environment (``SLURM_JOB_*``) when the agent may read it (root), otherwise from
  ``scontrol show job -d`` once per new job.  The node's state comes from ``scontrol show
  node`` once per ``controller_interval``.  Those are the only calls that reach slurmctld: they
  run in a background thread, at most one at a time, each with a timeout, and a scrape never
  waits for them.
- GPU -> job: a job's GRES indices (IDX) are positions in gres.conf's ``File=`` list, not NVML
  indices and not /dev/nvidiaN numbers.  The index is resolved to the device file, the device
  file to its minor number (stat), and the minor number to the GPU the GPU collector found
  with it (agent/gpus.py: NVML index, UUID); this collector makes no NVML call itself.
  The GPUs' compute processes are checked against that: a process of job A on
  a GPU attributed to job B is counted as a mismatch, and a GPU with no GRES record is attributed
  by its processes' cgroups.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from lockstep.agent import gpus as agent_gpus
from lockstep.agent.collector import Collector, CollectorContext, MetricSpec, NothingHere, Option
from lockstep.agent.config import parse_duration, parse_string
from lockstep.agent.files import read_text

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

_JOB_DIR = re.compile(r"^job_(\d+|s[0-9a-z]{13})$")
_IDX = re.compile(r"\(IDX:([0-9,\-]*)\)")


@dataclass
class LocalJob:
    """A job seen on this node: its id and where its cgroup data is."""

    job_id: str
    cpu_dir: Path | None = None  # v2: the job dir; v1: the cpuacct one
    memory_dir: Path | None = None
    cgroup_v2: bool = False
    pid_dirs: list[Path] = field(default_factory=list)  # dirs whose subtree holds its processes
    pids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class JobDetails:
    user: str = ""
    account: str = ""
    partition: str = ""
    name: str = ""
    array_job_id: str = ""
    array_task_id: str = ""
    gres_indices: tuple[int, ...] = ()


def expand_ranges(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def expand_brackets(text: str) -> list[str]:
    """Slurm's '/dev/nvidia[0-1,3]' -> ['/dev/nvidia0', '/dev/nvidia1', '/dev/nvidia3']."""
    match = re.search(r"\[([^\]]+)\]", text)
    if not match:
        return [text]
    head, tail = text[: match.start()], text[match.end() :]
    out = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        width = len(low)
        for n in range(int(low), int(high or low) + 1):
            out.extend(expand_brackets(f"{head}{n:0{width}d}{tail}"))
    return out


def parse_gres_conf(text: str, node: str) -> list[str]:
    """gres.conf's GPU device files for this node, in the order that defines GRES indices."""
    files: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        fields = {k.lower(): v for k, v in fields.items()}
        if fields.get("name") != "gpu" or "file" not in fields:
            continue
        names = fields.get("nodename")
        if names is not None and node not in expand_brackets(names) and names != node:
            continue
        files.extend(expand_brackets(fields["file"]))
    return files


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One record of ``scontrol -o show ...``: space-separated Key=Value, values may hold spaces
    only in the trailing fields (Reason=, Command=), which are split off by their key."""
    record: dict[str, str] = {}
    key = None
    for token in line.split(" "):
        if "=" in token and re.match(r"^[A-Za-z][A-Za-z:/_]*=", token):
            key, _, value = token.partition("=")
            record[key] = value
        elif key is not None:
            record[key] += " " + token
    return record


class SlurmCollector(Collector):
    name = "slurm"
    help = "Slurm jobs on this node: info, CPU, memory, OOM kills, GPUs; the node's state."
    default_interval = 15.0
    needs = ("gpu",)  # GPU attribution reads the GPU collector's inventory
    metrics = (
        JOB_INFO,
        JOB_GPU_INFO,
        JOB_CPU,
        JOB_MEMORY,
        JOB_OOM,
        JOB_PROCESSES,
        NODE_INFO,
        NODE_STATE,
        GPU_MISMATCHES,
        CONTROLLER_REQUESTS,
        CONTROLLER_FAILURES,
    )
    options = (
        Option("node_name", parse_string, "", "this node's name in Slurm (default: the short hostname)"),
        Option("gres_conf", parse_string, "", "gres.conf path (default: beside $SLURM_CONF, or /etc/slurm)"),
        Option(
            "controller_interval",
            parse_duration,
            120.0,
            "minimum time between rounds of requests to slurmctld (node state; new jobs when not root)",
        ),
        Option("controller_timeout", parse_duration, 10.0, "time limit of one request to slurmctld"),
        Option(
            "controller_wait",
            parse_duration,
            3.0,
            "how long a collection round waits for a refresh it started before using what it has",
        ),
    )

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.cgroup_root = context.paths.sysfs / "fs" / "cgroup"
        self.proc = context.paths.procfs
        self.rootfs = context.paths.rootfs
        opts = context.options
        self.node = opts.get("node_name") or os.uname().nodename.split(".")[0]
        self.gres_conf_path = opts.get("gres_conf") or ""
        self.scontrol: Callable[[list[str], float], str] = context.seams.scontrol or run_scontrol
        self.controller = ControllerCache(
            self.scontrol,
            self.node,
            interval=opts.get("controller_interval", 120.0),
            timeout=opts.get("controller_timeout", 10.0),
            log=self.log,
        )
        self._environ_details: dict[str, JobDetails] = {}

    # --- discovery -----------------------------------------------------------------------

    def _slurm_present(self) -> bool:
        """This node is a Slurm node: it has a slurm.conf (configless nodes: slurmd's cached
        copy under /run/slurm/conf) or runs slurmd."""
        candidates = [self.rootfs / "etc/slurm/slurm.conf", self.rootfs / "run/slurm/conf/slurm.conf"]
        if os.environ.get("SLURM_CONF"):
            candidates.append(Path(os.environ["SLURM_CONF"]))
        if any(path.exists() for path in candidates):
            return True
        try:
            return any(
                read_text(self.proc / entry / "comm").strip() == "slurmd"
                for entry in os.listdir(self.proc)
                if entry.isdigit() and os.path.exists(self.proc / entry / "comm")
            )
        except OSError:
            return False

    def job_cgroup_parents(self) -> tuple[list[Path], list[Path]]:
        """Where slurmd puts job cgroups on this node: v2 stepd scopes, v1 slurm* dirs."""
        v2 = sorted(self.cgroup_root.glob("*.slice/*slurmstepd.scope"))
        v1 = sorted(self.cgroup_root.glob("*/slurm*"))
        return v2, v1

    def discover_jobs(self) -> dict[str, LocalJob] | None:
        """Jobs from their cgroups, or None when this node has no Slurm job cgroups at all."""
        v2_scopes, v1_dirs = self.job_cgroup_parents()
        if not v2_scopes and not v1_dirs:
            return None
        jobs: dict[str, LocalJob] = {}
        # cgroup v2: system.slice/slurmstepd.scope/job_N, or <node>_slurmstepd.scope with multiple slurmd
        for scope in v2_scopes:
            for job_dir in _job_dirs(scope):
                job = jobs.setdefault(job_dir.name[4:], LocalJob(job_dir.name[4:]))
                job.cpu_dir = job.memory_dir = job_dir
                job.cgroup_v2 = True
                job.pid_dirs.append(job_dir)
        # cgroup v1: <controller>/slurm[_node]/uid_U/job_N in each controller hierarchy
        for slurm_dir in v1_dirs:
            controller = slurm_dir.parent.name
            for uid_dir in sorted(slurm_dir.glob("uid_*")):
                for job_dir in _job_dirs(uid_dir):
                    job = jobs.setdefault(job_dir.name[4:], LocalJob(job_dir.name[4:]))
                    if "cpuacct" in controller.split(","):
                        job.cpu_dir = job_dir
                    if controller == "memory":
                        job.memory_dir = job_dir
                    if controller in ("freezer", "pids") or not job.pid_dirs:
                        job.pid_dirs = [job_dir]
        for job in jobs.values():
            for directory in job.pid_dirs:
                job.pids |= _cgroup_pids(directory)
            job.pids = {pid for pid in job.pids if not self._is_slurmstepd(pid)}
        # A job cgroup with only slurmstepd, or nothing, left is a job that ended (or has not
        # started its processes yet); slurmd may remove the cgroup late.
        return {job_id: job for job_id, job in jobs.items() if job.pids}

    def _is_slurmstepd(self, pid: int) -> bool:
        try:
            return read_text(self.proc / str(pid) / "comm").strip() == "slurmstepd"
        except OSError:
            return True  # gone: not one of the job's processes any more

    def jobs_from_listpids(self) -> dict[str, LocalJob]:
        """Nodes without job cgroups: ask the local slurmd (not slurmctld) for the jobs' pids."""
        try:
            out = self.scontrol(["listpids"], 5.0)
        except (OSError, subprocess.SubprocessError):
            return {}
        jobs: dict[str, LocalJob] = {}
        for line in out.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit() and not self._is_slurmstepd(int(parts[0])):
                jobs.setdefault(parts[1], LocalJob(parts[1])).pids.add(int(parts[0]))
        return jobs

    # --- job details -----------------------------------------------------------------------

    def details_from_environ(self, job: LocalJob) -> JobDetails | None:
        """The job's SLURM_JOB_* variables from one of its processes, if readable (root only)."""
        if job.job_id in self._environ_details:
            return self._environ_details[job.job_id]
        for pid in sorted(job.pids):
            try:
                raw = (self.proc / str(pid) / "environ").read_bytes()
            except OSError:
                continue  # not ours to read (agent not root), or the process is gone
            env = dict(v.split("=", 1) for v in raw.decode(errors="replace").split("\0") if "=" in v)
            if env.get("SLURM_JOB_ID") != job.job_id and job.job_id.isdigit():
                continue
            if job.job_id.startswith("s") and env.get("SLURM_JOB_ID"):
                job.job_id = env["SLURM_JOB_ID"]  # a SLUID-named cgroup: report the numeric id
            gpus = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS") or ""
            details = JobDetails(
                user=env.get("SLURM_JOB_USER", ""),
                account=env.get("SLURM_JOB_ACCOUNT", ""),
                partition=env.get("SLURM_JOB_PARTITION", ""),
                name=env.get("SLURM_JOB_NAME", ""),
                array_job_id=env.get("SLURM_ARRAY_JOB_ID", ""),
                array_task_id=env.get("SLURM_ARRAY_TASK_ID", ""),
                gres_indices=tuple(expand_ranges(gpus)) if re.fullmatch(r"[0-9,\-]*", gpus) else (),
            )
            self._environ_details[job.job_id] = details
            return details
        return None

    # --- GPUs --------------------------------------------------------------------------------

    def gres_device_minors(self) -> list[int | None]:
        """For each GRES index, the minor number of its device file (None if it cannot be stat'ed)."""
        path = self.gres_conf_path
        if not path:
            conf = os.environ.get("SLURM_CONF")
            path = str(Path(conf).parent / "gres.conf") if conf else "/etc/slurm/gres.conf"
        try:
            files = parse_gres_conf(read_text(self.rootfs / path.lstrip("/")), self.node)
        except OSError:
            return []
        minors: list[int | None] = []
        for file in files:
            try:
                minors.append(os.minor(os.stat(self.rootfs / file.lstrip("/")).st_rdev))
            except OSError:
                minors.append(None)
        return minors

    # --- collection --------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        jobs = self.discover_jobs()
        if jobs is None:  # no job cgroups on this node (proctrack/linuxproc): ask the local slurmd
            jobs = self.jobs_from_listpids()
        if not jobs and not self._slurm_present():
            raise NothingHere("no Slurm here: no job cgroups, no slurm.conf (/etc/slurm or /run/slurm/conf), no slurmd")

        details: dict[str, JobDetails] = {}
        missing = []
        for job in jobs.values():
            found = self.details_from_environ(job)
            if found is None:
                missing.append(job.job_id)
            else:
                details[job.job_id] = found
        jobs = {job.job_id: job for job in jobs.values()}  # SLUID-named cgroups now keyed by job id
        controller = self.controller.snapshot(missing, wait=self.context.options.get("controller_wait", 3.0))
        for job_id in missing:
            if job_id in controller.jobs:
                details[job_id] = controller.jobs[job_id]
        # Forget finished jobs.
        self._environ_details = {k: v for k, v in self._environ_details.items() if k in details}
        self.controller.forget_except(set(jobs))

        info, cpu, memory, oom, processes = (
            s.family() for s in (JOB_INFO, JOB_CPU, JOB_MEMORY, JOB_OOM, JOB_PROCESSES)
        )
        for job_id, job in sorted(jobs.items()):
            d = details.get(job_id)
            if d is not None:
                info.add_metric([job_id, d.user, d.account, d.partition, d.name, d.array_job_id, d.array_task_id], 1)
            processes.add_metric([job_id], len(job.pids))
            for family, value in (
                (cpu, _cpu_seconds(job)),
                (memory, _memory_bytes(job)),
                (oom, _oom_kills(job)),
            ):
                if value is not None:
                    family.add_metric([job_id], value)
        yield from (info, cpu, memory, oom, processes)
        yield from self._gpu_families(jobs, details)
        yield from self._node_families(controller)
        yield from self.controller.counter_families()

    def _gpu_families(self, jobs: dict[str, LocalJob], details: dict[str, JobDetails]) -> Iterable[Metric]:
        gpus = agent_gpus.published()  # the GPU collector's latest round
        if not gpus:
            return
        by_minor = {gpu.minor_number: gpu for gpu in gpus if gpu.minor_number is not None}
        minors = self.gres_device_minors()
        allocated: dict[int, str] = {}  # NVML index -> job id, from GRES
        for job_id, d in details.items():
            for idx in d.gres_indices:
                if idx < len(minors) and minors[idx] in by_minor:
                    allocated[by_minor[minors[idx]].index] = job_id  # type: ignore[index]
        pid_job = {pid: job.job_id for job in jobs.values() for pid in job.pids}
        mismatches = 0
        for gpu in gpus:
            running = {pid_job[p.pid] for p in gpu.processes if p.pid in pid_job}
            if gpu.index in allocated:
                mismatches += bool(running - {allocated[gpu.index]})
            elif len(running) == 1:  # no GRES record (e.g. no gres.conf): trust the processes
                allocated[gpu.index] = running.pop()
        family = JOB_GPU_INFO.family()
        for gpu in gpus:
            if gpu.index in allocated:
                family.add_metric([allocated[gpu.index], str(gpu.index), gpu.uuid], 1)
        yield family
        gauge = GPU_MISMATCHES.family()
        gauge.add_metric([], mismatches)
        yield gauge

    def _node_families(self, controller: ControllerSnapshot) -> Iterable[Metric]:
        if controller.node is None:
            return
        info, state = NODE_INFO.family(), NODE_STATE.family()
        reason = controller.node.get("Reason", "")
        info.add_metric([self.node, controller.node.get("State", ""), "" if reason == "(null)" else reason], 1)
        for flag in controller.node.get("State", "").lower().replace("*", "").split("+"):
            if flag:
                state.add_metric([flag], 1)
        yield from (info, state)


def _job_dirs(parent: Path) -> list[Path]:
    try:
        return sorted(p for p in parent.iterdir() if _JOB_DIR.match(p.name) and p.is_dir())
    except OSError:
        return []


def _cgroup_pids(directory: Path) -> set[int]:
    """Every pid in a cgroup's subtree (cgroup.procs of each descendant)."""
    pids: set[int] = set()
    for dirpath, _dirs, files in os.walk(directory):
        if "cgroup.procs" in files:
            try:
                pids.update(int(p) for p in read_text(Path(dirpath) / "cgroup.procs").split())
            except (OSError, ValueError):
                continue
    return pids


def _read_int(path: Path) -> int | None:
    try:
        return int(read_text(path).strip())
    except (OSError, ValueError):
        return None


def _read_keyed(path: Path, key: str) -> int | None:
    try:
        for line in read_text(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def _cpu_seconds(job: LocalJob) -> float | None:
    if job.cpu_dir is None:
        return None
    if job.cgroup_v2:
        usec = _read_keyed(job.cpu_dir / "cpu.stat", "usage_usec")
        return usec / 1e6 if usec is not None else None
    nsec = _read_int(job.cpu_dir / "cpuacct.usage")
    return nsec / 1e9 if nsec is not None else None


def _memory_bytes(job: LocalJob) -> int | None:
    if job.memory_dir is None:
        return None
    name = "memory.current" if job.cgroup_v2 else "memory.usage_in_bytes"
    return _read_int(job.memory_dir / name)


def _oom_kills(job: LocalJob) -> int | None:
    if job.memory_dir is None:
        return None
    if job.cgroup_v2:
        return _read_keyed(job.memory_dir / "memory.events", "oom_kill")
    return _read_keyed(job.memory_dir / "memory.oom_control", "oom_kill")


def _why(exc: BaseException) -> str:
    """What scontrol said (its last stderr line), rather than Python's account of the exit."""
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"no answer within {exc.timeout:g}s"
    if isinstance(exc, subprocess.CalledProcessError):
        said = (exc.stderr or "").strip().splitlines()
        return f"exit status {exc.returncode}: {said[-1] if said else 'no message'}"
    return str(exc)


def run_scontrol(args: list[str], timeout: float) -> str:
    """``scontrol ARGS`` with a time limit; its stdout, or CalledProcessError/TimeoutExpired."""
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout, check=True).stdout


@dataclass(frozen=True)
class ControllerSnapshot:
    jobs: dict[str, JobDetails]
    node: dict[str, str] | None


class ControllerCache:
    """What slurmctld told us, refreshed in a background thread, rate-limited and time-limited.

    A refresh asks for the node's state and for the jobs nobody could tell us about yet; it
    starts at most once per ``interval``, never while another runs, and each command has a
    time limit.  A collection round waits for a refresh it started for at most ``wait``
    seconds, then carries on with what it has: a slow or dead slurmctld never stalls it.
    """

    def __init__(
        self, scontrol: Callable[[list[str], float], str], node: str, interval: float, timeout: float, log: Any
    ) -> None:
        self.scontrol = scontrol
        self.node_name = node
        self.interval = interval
        self.timeout = timeout
        self.log = log
        self._lock = threading.Lock()
        self._jobs: dict[str, JobDetails] = {}
        self._node: dict[str, str] | None = None
        self._last_start = -float("inf")
        self._thread: threading.Thread | None = None
        self.requests: dict[str, int] = {}
        self.failures: dict[str, int] = {}
        self.refreshed = threading.Event()

    def snapshot(self, missing: list[str], wait: float) -> ControllerSnapshot:
        """What is known now; starts a refresh when one is due, and waits for it up to ``wait``."""
        with self._lock:
            due = time.monotonic() - self._last_start >= self.interval
            idle = self._thread is None or not self._thread.is_alive()
            started = due and idle
            if started:
                self._last_start = time.monotonic()
                self.refreshed.clear()
                wanted = [j for j in missing if j not in self._jobs]
                self._thread = threading.Thread(
                    target=self._refresh, args=(wanted,), name="slurm-controller", daemon=True
                )
                self._thread.start()
        if started:
            self.refreshed.wait(wait)
        with self._lock:
            return ControllerSnapshot(dict(self._jobs), self._node)

    def forget_except(self, job_ids: set[str]) -> None:
        with self._lock:
            self._jobs = {k: v for k, v in self._jobs.items() if k in job_ids}

    def _run(self, command: str, *args: str) -> str | None:
        with self._lock:
            self.requests[command] = self.requests.get(command, 0) + 1
        try:
            return self.scontrol(list(args), self.timeout)
        except (OSError, subprocess.SubprocessError) as exc:
            with self._lock:
                self.failures[command] = self.failures.get(command, 0) + 1
            self.log.warning("slurmctld request failed", extra={"command": command, "error": _why(exc)})
            return None

    def _refresh(self, wanted: list[str]) -> None:
        try:
            for job_id in wanted:
                out = self._run("scontrol show job", "-d", "-o", "show", "job", job_id)
                if out:
                    details = _details_from_scontrol(out)
                    if details is not None:
                        with self._lock:
                            self._jobs[job_id] = details
            out = self._run("scontrol show node", "-o", "show", "node", self.node_name)
            if out and out.strip():
                with self._lock:
                    self._node = parse_scontrol_record(out.strip().splitlines()[0])
        finally:
            self.refreshed.set()

    def counter_families(self) -> Iterable[Metric]:
        requests, failures = CONTROLLER_REQUESTS.family(), CONTROLLER_FAILURES.family()
        with self._lock:
            for command in sorted(set(self.requests) | {"scontrol show node"}):
                requests.add_metric([command], self.requests.get(command, 0))
                failures.add_metric([command], self.failures.get(command, 0))
        yield from (requests, failures)


def _details_from_scontrol(out: str) -> JobDetails | None:
    """JobDetails from ``scontrol -d -o show job ID`` (the job line, then its node lines)."""
    lines = out.strip().splitlines()
    if not lines:
        return None
    record = parse_scontrol_record(lines[0])
    user = record.get("UserId", "").split("(")[0]
    indices: list[int] = []
    for match in _IDX.finditer(out):
        indices.extend(expand_ranges(match.group(1)))
    return JobDetails(
        user=user,
        account=record.get("Account", "") if record.get("Account") != "(null)" else "",
        partition=record.get("Partition", ""),
        name=record.get("JobName", ""),
        array_job_id=record.get("ArrayJobId", ""),
        array_task_id=record.get("ArrayTaskId", ""),
        gres_indices=tuple(indices),
    )
