"""A job's report from Prometheus (`lockstep report JOB`, docs/report.md): find the job's time
range, then each section asks for its series only.

One module a section, each with its queries and its judging together: job.py (which job, when,
where), gpus.py, steps.py, stragglers.py (and evidence.py, what their nodes showed),
checkpoints.py, fired.py (alerts, hangs, the post-mortem), events.py; scope.py holds what they
share.  notes.py then says it in plain language.  Thresholds come from lockstep/thresholds.py,
the module the alert rules are rendered from.

Durations measured on Prometheus' clock are multiplied by `time_scale` (1 in production; the
demo's --speed in the end-to-end tests, where the simulated node's clock runs faster).
"""

from __future__ import annotations

import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from lockstep import thresholds as T
from lockstep.report.checkpoints import checkpoint_section
from lockstep.report.events import event_section
from lockstep.report.evidence import evidence
from lockstep.report.fired import HANG_ALERTS, alert_section, post_mortem_of
from lockstep.report.gpus import gpu_section
from lockstep.report.job import find_job, job_section
from lockstep.report.model import Hang, Job, Report
from lockstep.report.notes import notes_for, verdict_for
from lockstep.report.prometheus import Prometheus, unswept
from lockstep.report.scope import Scope, host_of_instance
from lockstep.report.steps import steps_section
from lockstep.report.stragglers import nccl_stragglers, training_stragglers

SECTIONS_ALONGSIDE = 2  # the sections asking their queries beside the steps' (make_report)


def build_report(
    prom: Prometheus,
    job_id: str,
    cluster: str | None = None,
    *,
    now: float | None = None,
    time_scale: float = 1.0,
    grafana_url: str = T.GRAFANA_URL,
    ended: bool = False,
) -> Report:
    """The job's report as Prometheus has it at ``now``.  ``ended``: the caller knows the job has
    ended (the Slurm epilog, `--save`): it ends at its last sample, however recent; otherwise a
    job with a sample in the last RUNNING_WITHIN seconds is running."""
    with unswept():  # (a report is millions of small objects, none in a cycle: see unswept)
        return make_report(prom, job_id, cluster, time.time() if now is None else now, time_scale, grafana_url, ended)


def make_report(
    prom: Prometheus,
    job_id: str,
    cluster: str | None,
    now: float,
    time_scale: float,
    grafana_url: str,
    ended: bool,
) -> Report:
    scope = Scope(prom, job_id, cluster, scale=time_scale)
    find_job(scope, now, ended)
    job = job_section(scope, now, ended)
    host_of_instance(scope)  # asked once, before the sections that share it run side by side
    # Prometheus evaluates each query on one core, so the sections that read different series
    # ask theirs side by side: SECTIONS_ALONGSIDE of them beside the steps and the training
    # stragglers (which share rank_rates' answers, so they stay in one thread, in order).  On 2
    # cores that took a 1,024-rank day's report, its NCCL counters read, from 17.8 s to 11.4-13.4 s
    # (docs/performance.md).
    # Every query of every thread is within the report's one deadline (prom.deadline); when one
    # fails, the report does: the others' queries end at their next read, the rest never start.
    with ThreadPoolExecutor(SECTIONS_ALONGSIDE, thread_name_prefix="report") as pool:
        try:
            nccl = pool.submit(nccl_stragglers, scope)  # first: the largest reads
            gpus_asked = pool.submit(gpu_section, scope)
            events_asked = pool.submit(event_section, scope)
            checkpoints_asked = pool.submit(checkpoint_section, scope)
            alerts_asked = pool.submit(alert_section, scope, now)
            steps = steps_section(scope)
            stragglers = training_stragglers(scope) + nccl.result()
            gpus, events = gpus_asked.result(), events_asked.result()
            checkpoints, alerts = checkpoints_asked.result(), alerts_asked.result()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            prom.deadline.stop()
            raise
    for straggler in stragglers:
        evidence(scope, straggler)
    hangs = [
        Hang(a.alertname, a.start, a.labels.get("rank", ""), a.labels.get("host", ""), a.labels.get("gpu", ""))
        for a in alerts
        if a.alertname in HANG_ALERTS
    ]
    post_mortem = post_mortem_of(scope, steps, hangs)
    report = Report(
        job=job,
        verdict="",
        generated_at=now,
        prometheus=prom.url,
        grafana_url=grafana_link(grafana_url, job),
        gpus=gpus,
        steps=steps,
        stragglers=stragglers,
        checkpoints=checkpoints,
        hangs=hangs,
        post_mortem=post_mortem,
        alerts=alerts,
        events=events,
    )
    report.notes = notes_for(report)
    report.verdict = verdict_for(report)
    return report


def grafana_link(base: str, job: Job) -> str:
    query = {"var-job_id": job.job_id, "from": str(int(job.start * 1000)), "to": str(int(job.end * 1000))}
    if job.cluster:
        query = {"var-cluster": job.cluster, **query}
    return f"{base.rstrip('/')}/d/{T.SLURM_JOB_DASHBOARD_UID}?{urllib.parse.urlencode(query)}"
