"""`lockstep report JOB`: what happened to a job, in one page (docs/report.md).

A client of Prometheus, run by people and by the Slurm epilog, not by the daemon: it lives in
lockstep/report/, not agent/, imports nothing of the daemon or the collectors, and judges by the
thresholds and suspects the alert rules are rendered from (lockstep/thresholds.py,
lockstep/suspects.py).

prometheus.py asks Prometheus (over transport.py: one deadline a report, a cap on each answer);
build.py makes the report (model.py) from one module per section
(job, gpus, steps, stragglers and their evidence, checkpoints, fired alerts and hangs, events;
what they share in scope.py); notes.py says it in plain language; text.py, html.py and the JSON
of model.py render it; store.py keeps finished jobs' reports (the Slurm epilog writes them).
"""
