"""`lockstep report JOB`: what happened to a job, in one page (docs/report.md).

prometheus.py asks Prometheus, build.py makes the report (model.py) from the job's series,
notes.py says it in plain language, text.py, html.py and the JSON of model.py render it, and
store.py keeps finished jobs' reports (the Slurm epilog writes them).
"""
