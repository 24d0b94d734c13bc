"""Writes alerts/tests/stragglers.test.yml: the sustained straggler detectors and their suspects.

    .venv/bin/python -m alerts.tests.stragglers

The series are realistic enough that a hand-written `0+30x80` would not be: every rank has a
stable bias of up to 2 % and per-minute jitter of up to 3 %, all ranks slow down together in
an evaluation pass, and the job stops for a checkpoint save.  Their values are computed here
(seeded, so the file is the same on every run) and written out sample by sample; the expected
alerts and annotations below are exact.  tests/alerts/test_alert_rules.py fails when the checked-in
file differs from what this module writes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import yaml

from alerts.render import GROUP_EVAL_ORDER

OUT = Path(__file__).resolve().parent / "stragglers.test.yml"
MINUTES = 90
STEPS_PER_MINUTE = 60
COMPUTE = 0.5  # seconds per step on a typical rank
DATA_WAIT = 0.05
BIAS = (1.0, 1.01, 0.99, 1.015, 0.985, 1.005, 0.995, 1.02)  # stable per-rank speed, +-2 %
JITTER = 0.03  # per-minute mean compute time varies +-3 %
EVAL_PASS = range(20, 26)  # every rank computes 1.3x as long (evaluation batches)
CHECKPOINT = range(50, 54)  # no steps at all (a synchronous checkpoint save)
ONSET = 30  # minute a fault begins

RUNBOOK = "https://github.com/lockstep-observability/lockstep/blob/main/docs/runbooks.md#"
DASHBOARD = "http://grafana.example.com/d/lockstep-slurm-job/?var-cluster=c1&var-job_id={job}&viewPanel={panel}"


def labels(**pairs: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def cumulative(increments: Iterable[float]) -> str:
    total, values = 0.0, ["0"]
    for step in increments:
        total += step
        values.append(f"{total:.6g}")
    return " ".join(values)


def rank_series(
    job: str,
    rank: int,
    host: str,
    rng: random.Random,
    *,
    slow: float = 1.0,
    slow_data: float = 1.0,
    blip: range = range(0),
    instance: str = "n1:12400",
    bias: float | None = None,
    slow_from: int = ONSET,
    end: int = MINUTES,
) -> list[dict[str, str]]:
    """A rank's steps, compute and data wait counters, and its last step's time; slow/slow_data
    apply from slow_from on.  The job ends at minute `end`: the agent drops the rank a minute
    later (its process exited).  While the job pauses for a checkpoint its process still holds
    the log open, which the agent counts once the rank has been idle for a minute."""
    steps, compute, data, last_step, writers = [], [], [], ["0"], []
    for minute in range(MINUTES):
        factor = (BIAS[rank % len(BIAS)] if bias is None else bias) * (1 + rng.uniform(-JITTER, JITTER))
        if minute in EVAL_PASS:
            factor *= 1.3
        if minute >= slow_from:
            factor *= slow
        if minute in blip:
            factor *= 1.5
        n = 0 if minute in CHECKPOINT or minute >= end else STEPS_PER_MINUTE
        steps.append(n)
        compute.append(n * COMPUTE * factor)
        data.append(n * DATA_WAIT * (slow_data if minute >= slow_from else 1.0))
        last_step.append(str((minute + 1) * 60) if n else last_step[-1])
        writers.append("1" if minute in CHECKPOINT and minute > CHECKPOINT[0] else "_")
    where = labels(cluster="c1", job="lockstep", instance=instance, job_id=job, rank=str(rank), host=host)

    def ended(values: str) -> str:
        points = values.split()
        return " ".join(points[: end + 2] + ["_"] * (len(points) - end - 2))

    return [
        {"series": f"lockstep_training_steps_total{where}", "values": ended(cumulative(steps))},
        {"series": f"lockstep_training_compute_seconds_total{where}", "values": ended(cumulative(compute))},
        {"series": f"lockstep_training_data_wait_seconds_total{where}", "values": ended(cumulative(data))},
        {"series": f"lockstep_training_last_step_timestamp_seconds{where}", "values": ended(" ".join(last_step))},
    ] + ([{"series": f"lockstep_training_log_writer_processes{where}", "values": "_ " + " ".join(writers)}]
         if "1" in writers else [])  # fmt: skip


def node_series(instance: str, host: str) -> list[dict[str, str]]:
    return [
        {
            "series": "lockstep_slurm_node_info"
            + labels(cluster="c1", job="lockstep", instance=instance, slurm_node=host, state="ALLOCATED", reason=""),
            "values": f"1x{MINUTES}",
        }
    ]


def gpu_series(
    instance: str, job: str, gpu: int, rng: random.Random, *, slow_clock: float = 1.0, reason: str = ""
) -> list[dict[str, str]]:
    where = dict(cluster="c1", job="lockstep", instance=instance, gpu=str(gpu), uuid=f"GPU-{instance[:2]}-{gpu}")
    clocks = []
    for minute in range(MINUTES + 1):
        clock = 1980e6 * (1 + rng.uniform(-0.01, 0.01))  # boost clocks wander a little
        clocks.append(f"{clock * (slow_clock if minute >= ONSET else 1.0):.6g}")
    throttled = f"0x{ONSET - 1} 1x{MINUTES - ONSET + 1}" if reason else f"0x{MINUTES}"
    return [
        {"series": f"lockstep_slurm_job_gpu_info{labels(**where, job_id=job)}", "values": f"1x{MINUTES}"},
        {"series": f"lockstep_gpu_sm_clock_hertz{labels(**where)}", "values": " ".join(clocks)},
        {"series": f"lockstep_gpu_utilization_ratio{labels(**where)}", "values": f"0.97x{MINUTES}"},
        {
            "series": f"lockstep_gpu_clock_event_active{labels(**where, reason=reason or 'hw_thermal_slowdown')}",
            "values": throttled,
        },
    ]


def silent(*alertnames: str, at: Iterable[int]) -> list[dict[str, object]]:
    return [{"eval_time": f"{m}m", "alertname": name, "exp_alerts": []} for m in at for name in alertnames]


SLOWER = "LockstepTrainingSlowerThanPeers"
PAGING = ("LockstepTrainingStragglerSustained", "LockstepTrainingStraggler")
TRAINING = (*PAGING, SLOWER)
GPU = ("LockstepGPUStragglerSustained", "LockstepGPUStraggler")


def healthy() -> dict[str, object]:
    """Job 500: 8 biased, jittered ranks with an evaluation pass, a checkpoint save and a
    5-minute 1.5x blip of rank 2 (minutes 60-65); job 601: 4 ranks, one of them 5 % faster than
    the others throughout (issue 26's healthy job); GPUs (clocks wandering +-1 %; of a 2-GPU job
    600, the second 10 % slower: too few GPUs for the sensitive GPU test).  Nothing pages: the
    blip is named by the sequential ticket alone (LockstepTrainingSlowerThanPeers, issue 44: its
    rank was 1.5x slower than its peers for 5 minutes), held while its 10-minute mean stays over
    the hold ratio, and gone by minute 89."""
    rng = random.Random(500)
    series = []
    for rank in range(8):
        series += rank_series("500", rank, f"n{1 + rank // 4}", rng, blip=range(60, 65) if rank == 2 else range(0))
    for rank, bias in enumerate((1.0, 0.95, 1.01, 0.99)):
        series += rank_series("601", rank, "n4", rng, bias=bias)
    for gpu in range(8):
        series += gpu_series("n2:12400", "500", gpu, rng)
    for gpu in range(2):
        series += gpu_series("n3:12400", "600", gpu, rng, slow_clock=0.9 if gpu == 1 else 1.0)
    return {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [firing_ranks(m, [("500", 2, "n1")], SLOWER) for m in (66, 75)],
        "alert_rule_test": [
            *silent(*PAGING, *GPU, at=(25, 45, 55, 66, 75, 89)),
            *silent(SLOWER, at=(25, 45, 55, 89)),
        ],
    }


def rank_alert(job: str, rank: int, host: str, ratio: str, suspects: str) -> dict[str, object]:
    return {
        "exp_labels": {
            "severity": "warning",
            "cluster": "c1",
            "job": "lockstep",
            "instance": f"{host}:12400",  # the agent on the rank's host, not n1's that exports the rank
            "job_id": job,
            "rank": str(rank),
            "host": host,
        },
        "exp_annotations": {
            "summary": f"Rank {rank} of job {job} has been slower than its peers for 20 minutes",
            "description": (
                f"Rank {rank} of job {job} (host {host}) has taken {ratio}x its peers' time per step of its own "
                "work (compute and data wait) over the last 20 minutes: more than 5 % on average, and over 3 % in 90 % "
                "of the window's 5-minute means; where its job reports waiting in collectives, it is the rank the "
                "others wait for. The whole job runs at its pace. Suspects on its node in the last 30 minutes: "
                f"{suspects}."
            ),
            "runbook_url": RUNBOOK + "locksteptrainingstragglersustained",
            "suspects": suspects,
            "dashboard_url": DASHBOARD.format(job=job, panel=101),
        },
    }


def faults() -> dict[str, object]:
    """From minute 30: job 500's rank 5 (host n2) computes 10 % slower while n2's GPU 5 is
    held by thermal slowdown (its clock 9 % down) and n2 sends PFC pause 5 % of the time; job 501's
    rank 1 (host n3) waits for data 2.4x as long (12 % slower in all) while n3's /home hangs; job
    502's rank 0 (host n4) computes 10 % slower and n4 shows nothing.  Every rank's series are
    exported by n1's agent (the logs are on a shared filesystem)."""
    rng = random.Random(501)
    series = []
    for rank in range(8):
        series += rank_series("500", rank, f"n{1 + rank // 4}", rng, slow=1.1 if rank == 5 else 1.0)
    for rank in range(4):
        series += rank_series("501", rank, "n3", rng, slow_data=2.4 if rank == 1 else 1.0)
    for rank in range(4):
        series += rank_series("502", rank, "n4", rng, slow=1.1 if rank == 0 else 1.0)
    for instance, host in (("n1:12400", "n1"), ("n2:12400", "n2"), ("n3:12400", "n3"), ("n4:12400", "n4")):
        series += node_series(instance, host)
    # Two agents that name no host (no Slurm, no Kubernetes node label) must not break the joins.
    for instance in ("n5:12400", "n6:12400"):
        series.append(
            {
                "series": "lockstep_build_info" + labels(cluster="c1", job="lockstep", instance=instance, version="1"),
                "values": f"1x{MINUTES}",
            }
        )
    for gpu in range(8):
        series += gpu_series("n2:12400", "500", gpu, rng, slow_clock=0.91 if gpu == 5 else 1.0,
                             reason="hw_thermal_slowdown" if gpu == 5 else "")  # fmt: skip
    pause = f"0+0x{ONSET} 0+3x{MINUTES - ONSET}"  # 3 s a minute: 5 % of the time
    series += [
        {
            "series": "lockstep_pfc_pause_seconds_total"
            + labels(
                cluster="c1", job="lockstep", instance="n2:12400", interface="ens3f0np0", priority="3", direction="rx"
            ),
            "values": pause,
        },
        {
            "series": "lockstep_filesystem_responsive"
            + labels(cluster="c1", job="lockstep", instance="n3:12400", mountpoint="/home", fstype="nfs4"),
            "values": f"1x{ONSET} 0x{MINUTES - ONSET}",
        },
    ]
    gpu5 = {
        "severity": "warning",
        "cluster": "c1",
        "job": "lockstep",
        "instance": "n2:12400",
        "job_id": "500",
        "gpu": "5",
        "uuid": "GPU-n2-5",
    }
    return {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            # The sequential ticket names the three slow ranks within 10 minutes of the onset (the
            # alerts carry the instance of the rank's node's agent).
            *(
                firing_ranks(m, [("500", 5, "n2"), ("501", 1, "n3"), ("502", 0, "n4")], SLOWER, own_agents=True)
                for m in (40, 50)
            ),
            {
                "expr": "job_rank:lockstep_training_suspect:active30m",
                "eval_time": "60m",
                "exp_samples": [
                    {
                        "labels": "job_rank:lockstep_training_suspect:active30m"
                        + labels(cluster="c1", instance="n1:12400", job_id=job, rank=rank, host=host, suspect=suspect),
                        "value": 1,
                    }
                    for job, rank, host, suspect in (
                        ("500", "5", "n2", "gpu_throttle"),
                        ("500", "5", "n2", "pfc_pause"),
                        ("501", "1", "n3", "data_wait"),
                        ("501", "1", "n3", "hung_mount"),
                    )
                ],
            },
        ],
        "alert_rule_test": [
            *silent(*PAGING, *GPU, at=(40, 50)),
            {
                "eval_time": "63m",
                "alertname": "LockstepTrainingStragglerSustained",
                "exp_alerts": [
                    rank_alert("500", 5, "n2", "RATIO_500", "gpu_throttle, pfc_pause"),
                    rank_alert("501", 1, "n3", "RATIO_501", "data_wait, hung_mount"),
                    rank_alert("502", 0, "n4", "RATIO_502", "none found"),
                ],
            },
            {
                "eval_time": "61m",
                "alertname": "LockstepGPUStragglerSustained",
                "exp_alerts": [
                    {
                        "exp_labels": gpu5,
                        "exp_annotations": {
                            "summary": "GPU 5 on n2:12400 has been slower than the rest of job 500 for 30 minutes",
                            "description": (
                                "GPU 5 (GPU-n2-5) on n2:12400 has run its SM clock at GPU_RATIO % of the median of "
                                "job 500's busy GPUs over 30 minutes, more than 5 % and 3 times the job's spread (MAD) "
                                "below the median, and is still slower now. Suspects in the last 30 minutes: "
                                "gpu_throttle (hw_thermal_slowdown), pfc_pause."
                            ),
                            "runbook_url": RUNBOOK + "lockstepgpustragglersustained",
                            "suspects": "gpu_throttle (hw_thermal_slowdown), pfc_pause",
                            "dashboard_url": DASHBOARD.format(job="500", panel=102),
                        },
                    }
                ],
            },
            *silent("LockstepTrainingStraggler", "LockstepGPUStraggler", at=(61, 89)),
        ],
    }


def slower_alert(job: str, rank: int, host: str, ratio: str) -> dict[str, object]:
    """LockstepTrainingSlowerThanPeers for a rank exported by n1's agent, on a host without one."""
    return {
        "exp_labels": {
            "severity": "warning",
            "cluster": "c1",
            "job": "lockstep",
            "instance": "n1:12400",
            "job_id": job,
            "rank": str(rank),
            "host": host,
        },
        "exp_annotations": {
            "summary": f"Rank {rank} of job {job} computes slower than its peers",
            "description": (
                f"Rank {rank} of job {job} (host {host}) has taken {ratio}x its peers' time per step of its own "
                "work (compute and data wait) on average over the last 20 minutes (more than 4.75 %) or 5 (more "
                "than 7 %), and more than 4 % now. Where the others wait for it, "
                "LockstepTrainingStragglerSustained "
                "says so; where nothing does (a paced job, or another rank starts its steps later), the job loses "
                "no time to it, but its node is slower than its peers' and an unpaced job there will wait for it. "
                "Suspects on its node in the last 30 minutes: none found."
            ),
            "runbook_url": RUNBOOK + "locksteptrainingslowerthanpeers",
            "suspects": "none found",
            "dashboard_url": DASHBOARD.format(job=job, panel=101),
        },
    }


def firing_ranks(
    minute: int,
    ranks: list[tuple[str, int, str]],
    alertname: str = "LockstepTrainingStragglerSustained",
    *,
    own_agents: bool = False,
) -> dict[str, object]:
    """The alert (the sustained straggler's, unless told) firing at `minute` for exactly these
    (job, rank, host), all exported by n1's agent and alerted on n1's instance (on the host's own
    agent's with own_agents): by labels alone, where the window still holds the onset's ramp and
    the value's last digit depends on which rule group promtool evaluates first (it orders them
    at random)."""
    return {
        "expr": f'ALERTS{{alertname="{alertname}", alertstate="firing"}}',
        "eval_time": f"{minute}m",
        "exp_samples": [
            {
                "labels": "ALERTS"
                + labels(
                    alertname=alertname,
                    alertstate="firing",
                    cluster="c1",
                    host=host,
                    instance=f"{host}:12400" if own_agents else "n1:12400",
                    job="lockstep",
                    job_id=job,
                    rank=str(rank),
                    severity="warning",
                ),
                "value": 1,
            }
            for job, rank, host in ranks
        ],
    }


def onset_alert(job: str, rank: int, host: str, ratio: str) -> dict[str, object]:
    alert = rank_alert(job, rank, host, ratio, "none found")
    alert["exp_labels"]["instance"] = "n1:12400"  # type: ignore[index]  # host n5, n6: no agent there
    return alert


def onsets() -> dict[str, object]:
    """Ranks slow from the first minute, or from minute 60 after an hour of health (issue 34);
    every rank exported by n1's agent.  Job 600: 2 ranks, rank 1 10 % slower from the start.
    Job 700: 4 ranks, rank 1 5 % faster than the others throughout, rank 2 10 % slower in
    compute from minute 60.  Job 701: 2 ranks, rank 1 15 % slower from minute 60.  Job 702: 4
    ranks, rank 3 15 % slower from minute 60; the job ends at minute 85 (its ranks' processes
    exit) and its alert is gone 2 minutes later.  Each is named within 30 minutes of its onset
    (600 by minute 30, 700 and 701 by minute 84) and held until the end."""
    rng = random.Random(700)
    series = []
    for rank in range(2):
        series += rank_series("600", rank, "n5", rng, slow=1.1 if rank == 1 else 1.0, slow_from=0)
    for rank, bias in enumerate((1.0, 0.95, 1.01, 0.99)):
        series += rank_series("700", rank, "n5", rng, bias=bias, slow=1.1 if rank == 2 else 1.0, slow_from=60)
    for rank in range(2):
        series += rank_series("701", rank, "n5", rng, slow=1.15 if rank == 1 else 1.0, slow_from=60)
    for rank in range(4):
        series += rank_series("702", rank, "n6", rng, slow=1.15 if rank == 3 else 1.0, slow_from=60, end=85)
    return {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            firing_ranks(84, [("600", 1, "n5"), ("700", 2, "n5"), ("701", 1, "n5"), ("702", 3, "n6")]),
            firing_ranks(87, [("600", 1, "n5"), ("700", 2, "n5"), ("701", 1, "n5")]),
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "LockstepTrainingStragglerSustained",
                "exp_alerts": [onset_alert("600", 1, "n5", "RATIO_600")],
            },
            {
                "eval_time": "59m",
                "alertname": "LockstepTrainingStragglerSustained",
                "exp_alerts": [onset_alert("600", 1, "n5", "LATER_600")],
            },
            *silent("LockstepTrainingStraggler", at=(84, 89)),
            {
                "eval_time": "89m",
                "alertname": "LockstepTrainingStragglerSustained",
                "exp_alerts": [
                    onset_alert("600", 1, "n5", "END_600"),
                    onset_alert("700", 2, "n5", "RATIO_700"),
                    onset_alert("701", 1, "n5", "RATIO_701"),
                ],
            },
        ],
    }


def synchronous_job(
    job: str, host: str, ranks: int, slow: dict[int, list[float]], rng: random.Random
) -> list[dict[str, str]]:
    """A job whose ranks report comm wait as synchronous training makes it: every minute each
    rank computes COMPUTE times its slowdown that minute (slow[rank][minute], else 1) with
    +-1 % jitter, and waits in the all-reduce for the slowest rank of each step (its compute
    minus its own).  Exported by n1's agent."""
    series = []
    factors = [[slow.get(rank, [1.0] * MINUTES)[m] * (1 + rng.uniform(-0.01, 0.01)) for m in range(MINUTES)]
               for rank in range(ranks)]  # fmt: skip
    for rank in range(ranks):
        where = labels(cluster="c1", job="lockstep", instance="n1:12400", job_id=job, rank=str(rank), host=host)
        steps = [STEPS_PER_MINUTE] * MINUTES
        compute = [STEPS_PER_MINUTE * COMPUTE * factors[rank][m] for m in range(MINUTES)]
        comm = [STEPS_PER_MINUTE * COMPUTE * (max(f[m] for f in factors) - factors[rank][m]) for m in range(MINUTES)]
        last_step = " ".join(str(m * 60) for m in range(MINUTES + 1))
        series += [
            {"series": f"lockstep_training_steps_total{where}", "values": cumulative(steps)},
            {"series": f"lockstep_training_compute_seconds_total{where}", "values": cumulative(compute)},
            {"series": f"lockstep_training_comm_wait_seconds_total{where}", "values": cumulative(comm)},
            {"series": f"lockstep_training_last_step_timestamp_seconds{where}", "values": last_step},
        ]
    return series


def witnesses() -> dict[str, object]:
    """Jobs whose ranks report comm wait (the last-to-arrive witness) and the hold.  Job 800,
    8 ranks: from minute 30, rank 1 computes 8 % more and rank 2 15 % more: both stand well
    above their peers' median, but only rank 2 arrives last (rank 1 waits for it every step), so
    only rank 2 is named as holding the job back; both are slower than their peers (issue 44's
    second verdict: rank 1, which nothing waits for, is named by LockstepTrainingSlowerThanPeers
    alone).  Job 801: rank 3 12 % slower from minute 10, down to 1 % for minutes 60-66 (under the
    floor; its 10-minute share stays above the hold ratio), then 12 % again: named once by both,
    and held through the dip (no resolve, no second alert)."""
    rng = random.Random(800)
    job_800 = {1: [1.0] * 30 + [1.08] * (MINUTES - 30), 2: [1.0] * 30 + [1.15] * (MINUTES - 30)}
    dip = [1.0] * 10 + [1.12] * 50 + [1.01] * 6 + [1.12] * (MINUTES - 66)
    series = synchronous_job("800", "n5", 8, job_800, rng) + synchronous_job("801", "n6", 4, {3: dip}, rng)
    return {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            *(
                firing_ranks(m, [*([("800", 2, "n5")] if m >= 60 else []), ("801", 3, "n6")])
                for m in (40, 60, 63, 66, 69, 89)
            ),
            *(
                firing_ranks(m, [("800", 1, "n5"), ("800", 2, "n5"), ("801", 3, "n6")], SLOWER)
                for m in (40, 60, 63, 66, 69, 89)
            ),
        ],
        "alert_rule_test": [
            {
                "eval_time": "89m",
                "alertname": SLOWER,
                "exp_alerts": [
                    slower_alert("800", 1, "n5", "RATIO_800_1"),
                    slower_alert("800", 2, "n5", "RATIO_800_2"),
                    slower_alert("801", 3, "n6", "RATIO_801"),
                ],
            }
        ],
    }


HEADER = """\
# promtool test rules: the sustained straggler detectors (LockstepTrainingStragglerSustained,
# LockstepTrainingSlowerThanPeers, LockstepGPUStragglerSustained) and the suspects their alerts name.
# Generated by `python -m alerts.tests.stragglers` (see its docstring for the data): do not edit.
# Series are one sample a minute; eval times are minutes from the start.
"""


def render(ratios: dict[str, str] | None = None) -> str:
    document = {
        "rule_files": ["../lockstep-recording.rules.yml", "../lockstep-alerts.rules.yml"],
        "evaluation_interval": "1m",
        "group_eval_order": GROUP_EVAL_ORDER,
        "tests": [healthy(), faults(), onsets(), witnesses()],
    }
    text = yaml.dump(document, sort_keys=False, width=10_000)
    for placeholder, value in (ratios or MEASURED).items():
        text = text.replace(placeholder, value)
    return HEADER + text


# The values the alerts report, as promtool computes them from the series above.
MEASURED = {
    "RATIO_500": "1.08",
    "RATIO_501": "1.14",
    "RATIO_502": "1.07",
    "GPU_RATIO": "91",
    "RATIO_600": "1.10",
    "LATER_600": "1.10",
    "LATE_600": "1.10",
    "END_600": "1.10",
    "RATIO_700": "1.10",
    "RATIO_701": "1.14",
    "RATIO_800_1": "1.08",
    "RATIO_800_2": "1.15",
    "RATIO_801": "1.12",
}

if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
