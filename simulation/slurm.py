"""The simulated node's Slurm: job 4242 of user alice on all 8 GPUs, in a cgroup v2 tree.

The job's processes' environment is readable (as for an agent running as root), so the
collector needs slurmctld only for the node's state, which a fake ``scontrol`` answers.
In ``training-finished`` (workloads.py) the job has ended: no job on the node.  In
``idle-gpu-free`` (gpu.py) the job holds GPUs 0-5 only: GPUs 6 and 7 are free.  In ``hang-end``
and ``hang-killed`` (timeline.py) the job ends during the demo: its cgroup is left empty, as
slurmd leaves it until it removes it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lockstep.collectors.slurm.scontrol import SCONTROL
from lockstep.simulation.timeline import hang_phase

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

JOB_ID = "4242"
NODE = "node001"  # as the training logs name this host
STEPD_PID = 2101
TRAINING_PID = 2200
# The job's StdOut and StdErr (scontrol show job): its framework's output (framework_logs.py).
JOB_STDOUT = f"/scratch/runs/llama-70b__job={JOB_ID}__task=0/slurm-{JOB_ID}.out"


def build(node: SimulatedNode, t: float) -> None:
    node.seams.replace(SCONTROL.replaced_by(_scontrol))
    node.options.setdefault("slurm", {})["node_name"] = NODE
    if node.scenario == "training-finished":
        return  # the job ended: no job cgroup, no job process
    gpus = "0,1,2,3,4,5" if node.scenario == "idle-gpu-free" else "0,1,2,3,4,5,6,7"
    job = node.paths.sysfs / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope" / f"job_{JOB_ID}"
    node.write(job / "cpu.stat", f"usage_usec {int((3600 + t) * 8 * 0.92 * 1e6)}\n")
    node.write(job / "memory.current", f"{412 * 2**30 + int(t) * 4096}\n")
    node.write(job / "memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    ended = hang_phase(node.scenario, t) == "ended"
    node.write(job / "step_batch" / "user" / "task_0" / "cgroup.procs", "" if ended else f"{TRAINING_PID}\n")
    environ = {
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_ACCOUNT": "llm-pretrain",
        "SLURM_JOB_PARTITION": "h100",
        "SLURM_JOB_NAME": "llama-70b-pretrain",
        "SLURM_JOB_GPUS": gpus,
        "CUDA_VISIBLE_DEVICES": gpus,
    }
    node.write(node.paths.procfs / str(TRAINING_PID) / "environ", "".join(f"{k}={v}\0" for k, v in environ.items()))


def _scontrol(args: list[str], timeout: float) -> str:
    if args[-3:] == ["show", "node", NODE]:
        return f"NodeName={NODE} Arch=x86_64 CPUTot=16 Gres=gpu:h100:8 State=ALLOCATED Partitions=h100 Reason=(null)\n"
    if args == ["-o", "show", "job", JOB_ID]:
        # alice's uid is the demo's own: the simulated node's files (the job's StdOut) are the
        # demo's, and framework_logs counts a job's output only when its user owns it.
        uid = os.getuid()
        return (
            f"JobId={JOB_ID} JobName=llama-70b-pretrain UserId=alice({uid}) GroupId=alice({uid}) JobState=RUNNING "
            f"Partition=h100 NodeList=node[001-002] BatchHost={NODE} NumNodes=2 NumCPUs=32 "
            f"WorkDir=/scratch/runs/llama-70b__job={JOB_ID}__task=0 StdErr={JOB_STDOUT} StdIn=/dev/null "
            f"StdOut={JOB_STDOUT} Power=\n"
        )
    raise OSError(f"simulated scontrol: no answer for {' '.join(args)}")
