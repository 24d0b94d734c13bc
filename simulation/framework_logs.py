"""The simulated node's training framework output: job 4242's StdOut, as Megatron-LM prints it.

Job 4242's batch step runs here (BatchHost node001), and its StdOut, which the fake
``scontrol -o show job 4242`` names (slurm.py), is
``/scratch/runs/llama-70b__job=4242__task=0/slurm-4242.out`` (rootfs).  The framework_logs
collector finds it through the job's process (pid 2200) and scontrol, as on a real node.

Every scenario but issue 35's hangs (``hang-*``, whose job prints no step reports): Megatron-LM
(the format of tests/fixtures/framework_logs/megatron.log) with
``--log-interval 10 --log-straggler``, 1.8 s an iteration from 30 minutes before the demo, a
40-s checkpoint save every 500 iterations.

``framework-stall``: the job printed its last report at FRAMEWORK_STALL_AT (12 minutes before
the demo) and nothing since; its process is still on the node.  ``framework-slowdown``: the
job is a torchtitan one (tests/fixtures/framework_logs/torchtitan.log) logging every step
(``--metrics.log_freq 1``), 2.1 s a step for the 30 minutes before the demo, and from
FRAMEWORK_SLOW_AT (20 s into it) 1.5x slower.  In both the ranks write no
per-rank step logs and no NCCL telemetry (workloads.py): the framework's own output is all
there is to see the job by.

The file is appended to (never replaced: the collector would take that for a rotation), and
its content is a pure function of (scenario, t).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import TYPE_CHECKING

from lockstep.simulation import Scenario
from lockstep.simulation.slurm import JOB_STDOUT, NODE
from lockstep.simulation.timeline import FRAMEWORK_SLOW_AT, FRAMEWORK_STALL_AT, HANG_SCENARIOS
from lockstep.simulation.workloads import DEMO_EPOCH

if TYPE_CHECKING:
    from lockstep.simulation import SimulatedNode

SCENARIOS = (
    Scenario(
        "framework-stall",
        "Job 4242 (Megatron-LM, no per-rank step logs, no NCCL telemetry) printed its last iteration "
        "12 minutes ago: its StdOut is all that shows it stopped.",
    ),
    Scenario(
        "framework-slowdown",
        "Job 4242 (torchtitan, no per-rank step logs) takes 1.5x as long a step from 20 s into the demo, "
        "by the timestamps of its own step lines.",
    ),
)

START = -1800.0  # the job's first iteration, seconds relative to t=0
MEGATRON_SECONDS = 1.8
LOG_INTERVAL = 10
SAVE_EVERY = 500
SAVE_SECONDS = 40.0
TITAN_SECONDS = 2.1
TITAN_SLOW = 1.5
TITAN_LOG_FREQ = 1  # --metrics.log_freq 1: a line every step (the default is 10)
GLOBAL_BATCH = 512
TRAIN_ITERS = 500_000

_written: dict[str, tuple[int, int]] = {}  # path -> (lines written, size after)


def build(node: SimulatedNode, t: float) -> None:
    node.options["framework_logs"] = {"node_name": NODE, "start_at": "beginning"}
    if node.scenario == "training-finished":
        return  # the job ended
    path = node.paths.rootfs / JOB_STDOUT.lstrip("/")
    lines, last = output(node.scenario, t)
    written, size = _written.get(str(path), (0, -1))
    if not path.exists() or path.stat().st_size != size or written > len(lines):
        node.write(path, "".join(lines))
    else:
        with open(path, "a") as out:
            out.write("".join(lines[written:]))
    # Its mtime is when the job last printed, on the simulated clock (the collector's WALL_CLOCK).
    os.utime(path, (DEMO_EPOCH + last, DEMO_EPOCH + last))
    _written[str(path)] = (len(lines), path.stat().st_size)


def _stamp(t: float, micro: bool = True) -> str:
    moment = datetime.fromtimestamp(DEMO_EPOCH + t)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f" if micro else "%Y-%m-%d %H:%M:%S")


def output(scenario: str, t: float) -> tuple[list[str], float]:
    """The lines the job printed by time t, and when it printed the last (simulated seconds)."""
    if scenario in HANG_SCENARIOS:
        # Issue 35's hangs are seen through step logs and NCCL's telemetry: there the job's
        # framework prints no step reports (its StdOut holds the launcher's lines only).
        return [f"Launching llama-70b-pretrain on {NODE}\n"], START
    if scenario == "framework-slowdown":
        return _torchtitan(t)
    return _megatron(scenario, t)


def _megatron(scenario: str, t: float) -> tuple[list[str], float]:
    lines = [f"Launching llama-70b-pretrain on {NODE}\n", "> building GPT model ...\n"]
    now = START
    iteration = 0
    stop = min(t, FRAMEWORK_STALL_AT) if scenario == "framework-stall" else t
    while True:
        # The first iteration is reported, then every log_interval-th (iteration % 10 == 0).
        done = 1 if iteration == 0 else LOG_INTERVAL - iteration % LOG_INTERVAL
        seconds = 30.0 if iteration == 0 else MEGATRON_SECONDS + 0.0002 * (iteration // 10 % 5)
        if now + done * seconds > stop:
            return lines, now
        now += done * seconds
        iteration += done
        lines.append(
            f" [{_stamp(now)}] iteration {iteration:8d}/{TRAIN_ITERS:8d} |"
            f" consumed samples: {iteration * GLOBAL_BATCH:12d} |"
            f" elapsed time per iteration (ms): {seconds * 1000.0:.1f} |"
            f" throughput per GPU (TFLOP/s/GPU): 401.2 | learning rate: 1.500000E-04 |"
            f" global batch size: {GLOBAL_BATCH:5d} | lm loss: {7.0 - iteration / 10000:.6E} |"
            " loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |\n"
        )
        if iteration % 100 == 0:
            lines.append(
                f"[{_stamp(now, micro=False)}] | MnRtt/Rnk: 1795.12ms/5 | MxRtt/Rnk: 1801.90ms/12 |"
                " MnPwr/Rnk: 612.00W/3 | MxPwr/Rnk: 698.50W/9 | MnTmp/Rnk: 61.00C/2 | MxTmp/Rnk: 74.00C/12 |"
                " MnUtl/Rnk: 97.00%/12 | MxUtl/Rnk: 100.00%/0 | MnClk/Rnk: 1755.00/12 | MxClk/Rnk: 1980.00/4 |"
                " MnDRtt/Rnk: 1.20ms/7 | MxDRtt/Rnk: 3.40ms/1 | MnEtpt/Rnk: 388.12TF/12 | MxEtpt/Rnk: 421.55TF/5\n"
            )
        if iteration % SAVE_EVERY == 0:
            lines.append(
                f"[{_stamp(now)}] saving checkpoint at iteration {iteration:7d} to /lustre/ckpt/llama-70b"
                " in torch_dist format\n"
            )
            if now + SAVE_SECONDS > stop:
                return lines, now  # still saving
            now += SAVE_SECONDS
            lines.append(
                f"  [{_stamp(now)}] successfully saved checkpoint from iteration {iteration:7d} to"
                " /lustre/ckpt/llama-70b [ t 1/8, gtp_remat 0/1, p 1/1 ]\n"
            )


def _torchtitan(t: float) -> tuple[list[str], float]:
    lines = ["[titan] starting job: Llama 3 8B training\n"]
    now = START
    step = 0
    while True:
        target = 1 if step == 0 else step + TITAN_LOG_FREQ - step % TITAN_LOG_FREQ
        seconds = TITAN_SECONDS * (TITAN_SLOW if now >= FRAMEWORK_SLOW_AT else 1.0)
        if now + (target - step) * seconds > t:
            return lines, now
        now += (target - step) * seconds
        tps = round(8192 * 2 / seconds)
        step = target
        stamp = f"{datetime.fromtimestamp(DEMO_EPOCH + now):%Y-%m-%d %H:%M:%S},{int(now * 1000) % 1000:03d}"
        lines.append(
            f"[titan] {stamp} - root - INFO - \x1b[31mstep: {step:2}  \x1b[32mloss: {7.1 - step / 1000:8.5f}  "
            f"\x1b[38;2;180;60;0mgrad_norm:  1.2345  \x1b[38;2;54;234;195mmemory: 31.20GiB(39.43%)  "
            f"\x1b[34mtps: {tps:,}  \x1b[36mtflops: 374.49  \x1b[35mmfu: 37.87%\x1b[39m\n"
        )
