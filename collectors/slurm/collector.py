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
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lockstep.agent.collector import Collector, CollectorContext, Families, MetricSpec, NothingHere
from lockstep.agent.families import Metric
from lockstep.agent.files import read_text
from lockstep.agent.options import option, parse_duration, parse_string
from lockstep.collectors.slurm.cgroups import LocalJob, cgroup_pids, cpu_seconds, job_dirs, memory_bytes, oom_kills
from lockstep.collectors.slurm.gres import expand_ranges, parse_gres_conf
from lockstep.collectors.slurm.metrics import (
    CONTROLLER_FAILURES,
    CONTROLLER_REQUESTS,
    GPU_MISMATCHES,
    JOB_CPU,
    JOB_GPU_INFO,
    JOB_GPU_MEMORY,
    JOB_GPU_SM,
    JOB_INFO,
    JOB_MEMORY,
    JOB_OOM,
    JOB_PROCESSES,
    NODE_INFO,
    NODE_STATE,
    SKIPPED_GPU_LISTS,
)
from lockstep.collectors.slurm.scontrol import (
    SCONTROL,
    ControllerCache,
    ControllerSnapshot,
    JobDetails,
    run_scontrol,
    why,
)
from lockstep.collectors.toolkit.procs import process_table


@dataclass(frozen=True)
class SlurmOptions:
    node_name: str = option("", parse_string, "this node's name in Slurm (default: the short hostname)")
    gres_conf: str = option("", parse_string, "gres.conf path (default: beside $SLURM_CONF, or /etc/slurm)")
    controller_interval: float = option(
        120.0,
        parse_duration,
        "minimum time between rounds of requests to slurmctld (node state; new jobs when not root)",
    )
    controller_timeout: float = option(10.0, parse_duration, "time limit of one request to slurmctld")
    controller_wait: float = option(
        3.0,
        parse_duration,
        "how long a collection round waits for a refresh it started before using what it has",
    )


NO_SLURM = "no Slurm here: no job cgroups, no slurm.conf (/etc/slurm or /run/slurm/conf), no slurmd"


class SlurmCollector(Collector[SlurmOptions]):
    name = "slurm"
    help = "Slurm jobs on this node: info, CPU, memory, OOM kills, GPUs; the node's state."
    default_interval = 15.0
    needs = ("gpu",)  # GPU attribution reads the GPU collector's inventory
    metrics = (
        JOB_INFO,
        JOB_CPU,
        JOB_MEMORY,
        JOB_OOM,
        JOB_PROCESSES,
        JOB_GPU_INFO,
        JOB_GPU_SM,
        JOB_GPU_MEMORY,
        GPU_MISMATCHES,
        NODE_INFO,
        NODE_STATE,
        CONTROLLER_REQUESTS,
        CONTROLLER_FAILURES,
        SKIPPED_GPU_LISTS,
    )
    options_class = SlurmOptions

    def __init__(self, context: CollectorContext) -> None:
        super().__init__(context)
        self.cgroup_root = context.paths.sysfs / "fs" / "cgroup"
        self.proc = context.paths.procfs
        self.rootfs = context.paths.rootfs
        self.node = self.options.node_name or os.uname().nodename.split(".")[0]
        self.scontrol: Callable[[list[str], float], str] = context.seams.get(SCONTROL) or run_scontrol
        self.controller = ControllerCache(
            self.scontrol,
            self.node,
            interval=self.options.controller_interval,
            timeout=self.options.controller_timeout,
            log=self.log,
        )
        self._environ_details: dict[str, JobDetails] = {}
        self._skipped_gpu_lists = 0  # lockstep_slurm_skipped_gpu_lists_total
        self._listpids_error = ""

    # --- discovery -----------------------------------------------------------------------

    def _slurm_present(self) -> bool:
        """This node is a Slurm node: it has a slurm.conf (configless nodes: slurmd's cached
        copy under /run/slurm/conf) or runs slurmd."""
        candidates = [self.rootfs / "etc/slurm/slurm.conf", self.rootfs / "run/slurm/conf/slurm.conf"]
        if os.environ.get("SLURM_CONF"):
            candidates.append(Path(os.environ["SLURM_CONF"]))
        if any(path.exists() for path in candidates):
            return True
        # Every process of the node, every round on a node without Slurm: from the process table
        # the round's other collectors read too (its command name is /proc/PID/comm's).
        return any(process.comm == "slurmd" for process in process_table(self.proc).values())

    def job_cgroup_parents(self) -> tuple[list[Path], list[Path]]:
        """Where slurmd puts job cgroups on this node: v2 stepd scopes, v1 slurm* dirs."""
        v2 = sorted(self.cgroup_root.glob("*.slice/*slurmstepd.scope"))
        v1 = sorted(self.cgroup_root.glob("*/slurm*"))
        return v2, v1

    def discover_jobs(self) -> dict[str, LocalJob] | None:
        """Jobs from their cgroups, or None when this node has no Slurm job cgroups at all."""
        v2_scopes, v1_dirs = self.job_cgroup_parents()
        if not any(job_dirs(scope) for scope in v2_scopes) and not any(
            job_dirs(uid_dir) for slurm_dir in v1_dirs for uid_dir in slurm_dir.glob("uid_*")
        ):
            # No job cgroup at all: slurmd does not make them (proctrack/linuxproc), though empty
            # slurm_<node> directories may be left from when it did, or by a test run.
            return None
        jobs: dict[str, LocalJob] = {}
        # cgroup v2: system.slice/slurmstepd.scope/job_N, or <node>_slurmstepd.scope with multiple slurmd
        for scope in v2_scopes:
            for job_dir in job_dirs(scope):
                job = jobs.setdefault(job_dir.name[4:], LocalJob(job_dir.name[4:]))
                job.cpu_dir = job.memory_dir = job_dir
                job.cgroup_v2 = True
                job.pid_dirs.append(job_dir)
        # cgroup v1: <controller>/slurm[_node]/uid_U/job_N in each controller hierarchy
        for slurm_dir in v1_dirs:
            controller = slurm_dir.parent.name
            for uid_dir in sorted(slurm_dir.glob("uid_*")):
                for job_dir in job_dirs(uid_dir):
                    job = jobs.setdefault(job_dir.name[4:], LocalJob(job_dir.name[4:]))
                    if "cpuacct" in controller.split(","):
                        job.cpu_dir = job_dir
                    if controller == "memory":
                        job.memory_dir = job_dir
                    if controller in ("freezer", "pids") or not job.pid_dirs:
                        job.pid_dirs = [job_dir]
        for job in jobs.values():
            for directory in job.pid_dirs:
                job.pids |= cgroup_pids(directory)
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
        except (OSError, subprocess.SubprocessError) as exc:
            error = why(exc)
            if error != self._listpids_error:  # once per change
                self.log.warning("scontrol listpids failed", extra={"error": error})
            self._listpids_error = error
            return {}
        self._listpids_error = ""
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
            try:
                gres_indices = tuple(expand_ranges(gpus))
            except ValueError as exc:
                # The job's own user sets its environment: a bad list loses this job's GPU
                # attribution (its processes' cgroups still attribute GPUs), nothing else.
                # Details are kept per job, so this is logged once per job, not per round.
                self.log.warning("job's GPU list skipped", extra={"job_id": job.job_id, "reason": str(exc)})
                self._skipped_gpu_lists += 1
                gres_indices = ()
            details = JobDetails(
                user=env.get("SLURM_JOB_USER", ""),
                account=env.get("SLURM_JOB_ACCOUNT", ""),
                partition=env.get("SLURM_JOB_PARTITION", ""),
                name=env.get("SLURM_JOB_NAME", ""),
                array_job_id=env.get("SLURM_ARRAY_JOB_ID", ""),
                array_task_id=env.get("SLURM_ARRAY_TASK_ID", ""),
                gres_indices=gres_indices,
            )
            self._environ_details[job.job_id] = details
            return details
        return None

    # --- GPUs --------------------------------------------------------------------------------

    def gres_device_minors(self) -> list[int | None]:
        """For each GRES index, the minor number of its device file (None if it cannot be stat'ed)."""
        path = self.options.gres_conf
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
        if jobs is None:
            # No job cgroups on this node (proctrack/linuxproc), or no Slurm at all: ask the local
            # slurmd, a process started every round, only on a Slurm node (docs/performance.md).
            if not self._slurm_present():
                raise NothingHere(NO_SLURM)
            jobs = self.jobs_from_listpids()
        elif not jobs and not self._slurm_present():
            raise NothingHere(NO_SLURM)

        details: dict[str, JobDetails] = {}
        missing = []
        for job in jobs.values():
            found = self.details_from_environ(job)
            if found is None:
                missing.append(job.job_id)
            else:
                details[job.job_id] = found
        jobs = {job.job_id: job for job in jobs.values()}  # SLUID-named cgroups now keyed by job id
        controller = self.controller.snapshot(missing, wait=self.options.controller_wait)
        for job_id in missing:
            if job_id in controller.jobs:
                details[job_id] = controller.jobs[job_id]
        # Forget finished jobs.
        self._environ_details = {k: v for k, v in self._environ_details.items() if k in details}
        self.controller.forget_except(set(jobs))

        families = Families(self.metrics)
        for job_id, job in sorted(jobs.items()):
            d = details.get(job_id)
            if d is not None:
                families[JOB_INFO].add_metric(
                    [job_id, d.user, d.account, d.partition, d.name, d.array_job_id, d.array_task_id], 1
                )
            families[JOB_PROCESSES].add_metric([job_id], len(job.pids))
            for spec, value in (
                (JOB_CPU, cpu_seconds(job)),
                (JOB_MEMORY, memory_bytes(job)),
                (JOB_OOM, oom_kills(job)),
            ):
                if value is not None:
                    families[spec].add_metric([job_id], value)
        absent: set[MetricSpec] = set()
        if not self._add_gpus(families, jobs, details):
            absent.update((JOB_GPU_INFO, JOB_GPU_SM, JOB_GPU_MEMORY, GPU_MISMATCHES))
        if not self._add_node(families, controller):
            absent.update((NODE_INFO, NODE_STATE))
        self.controller.add_counters(families)
        families[SKIPPED_GPU_LISTS].add_metric([], self._skipped_gpu_lists)
        # Every family is exposed each round, with samples or not, except the GPU ones while the
        # GPU collector has published no GPUs and the node's while slurmctld has not described it.
        yield from (families[spec] for spec in self.metrics if spec not in absent)

    def _add_gpus(self, families: Families, jobs: dict[str, LocalJob], details: dict[str, JobDetails]) -> bool:
        """GPU -> job attribution; False when the GPU collector has published no GPUs."""
        gpus = self.context.gpu_inventory.published()  # the GPU collector's latest round
        if not gpus:
            return False
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
        for gpu in gpus:
            if gpu.index in allocated:
                families[JOB_GPU_INFO].add_metric([allocated[gpu.index], str(gpu.index), gpu.uuid], 1)
        families[GPU_MISMATCHES].add_metric([], mismatches)
        # Each job's share of each GPU its processes run on (several jobs on a shared GPU):
        # NVML's per-process samples (agent/gpus.py) summed per job; never a series per PID.
        for gpu in gpus:
            shares: dict[str, tuple[float, float]] = {}
            for p in gpu.processes:
                if p.pid in pid_job and p.sm_utilization is not None:
                    sm, memory = shares.get(pid_job[p.pid], (0.0, 0.0))
                    shares[pid_job[p.pid]] = (sm + p.sm_utilization, memory + (p.memory_utilization or 0.0))
            for job_id, (sm, memory) in sorted(shares.items()):
                families[JOB_GPU_SM].add_metric([job_id, str(gpu.index), gpu.uuid], sm)
                families[JOB_GPU_MEMORY].add_metric([job_id, str(gpu.index), gpu.uuid], memory)
        return True

    def _add_node(self, families: Families, controller: ControllerSnapshot) -> bool:
        """The node's state as slurmctld last told it; False when it has not (yet)."""
        if controller.node is None:
            return False
        reason = controller.node.get("Reason", "")
        families[NODE_INFO].add_metric(
            [self.node, controller.node.get("State", ""), "" if reason == "(null)" else reason], 1
        )
        for flag in controller.node.get("State", "").lower().replace("*", "").split("+"):
            if flag:
                families[NODE_STATE].add_metric([flag], 1)
        return True
