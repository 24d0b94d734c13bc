"""Finished jobs keep their report: the Slurm epilog (deploy/slurm/lockstep-report-epilog.sh)
writes the compact JSON to the store when the job ends; `lockstep report` reads it first.

One file per job: STORE/<cluster>/<job_id>.json (`_` for no cluster), written atomically.
The cluster and the job id come from Prometheus' labels and the command line: each is one
folder or file name, its characters other than letters, digits, `.`, `_` and `-` written `_`
(`/` and NUL too).  A cluster folder that would leave the store or hide in it (`..`, `.`, any
leading dot: `*/` does not list it) and an empty name are refused (issue 46: a series labelled
`cluster=".."` wrote `STORE/../JOB.json`); a job id's file always ends `.json`.  The path is
checked to be inside the store, as a last guard.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from lockstep.report.model import Report, ReportError, from_json, to_json

DEFAULT_STORE = "/var/lib/lockstep/reports"
STORE_ENV = "LOCKSTEP_REPORT_STORE"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def store_dir(given: str | None) -> Path:
    return Path(given or os.environ.get(STORE_ENV) or DEFAULT_STORE)


def path_of(store: Path, job_id: str, cluster: str | None) -> Path:
    """The job's file in the store; ReportError for a cluster or job id that is no name there."""
    folder = _name(cluster, "cluster", "folder", leading_dot=False) if cluster else "_"
    path = store / folder / f"{_name(job_id, 'job id', 'file')}.json"
    inside = os.path.normpath(store)
    if os.path.commonpath([inside, os.path.normpath(path)]) != inside:  # (what _name lets by cannot)
        raise ReportError(f"the report of job {job_id!r} would be stored outside {store}: refused")
    return path


def _name(given: str, what: str, kind: str, leading_dot: bool = True) -> str:
    name = _SAFE.sub("_", given)
    if not name or (name.startswith(".") and not leading_dot):
        raise ReportError(f"{what} {given!r} cannot name a {kind} in the report store: refused")
    return name


def load(store: Path, job_id: str, cluster: str | None) -> Report | None:
    """The stored report, None when there is none; ValueError when the file is not a report.
    Without a cluster, the job's report in whichever cluster's folder holds one (the epilog
    stores it under the cluster Prometheus named); ReportError when several do."""
    if cluster is None:
        found = sorted(store.glob(f"*/{_name(job_id, 'job id', 'file')}.json"))
        if len(found) > 1:
            clusters = ", ".join(path.parent.name for path in found)
            raise ReportError(f"job {job_id} has reports stored for clusters {clusters}: choose one with --cluster")
        path = found[0] if found else path_of(store, job_id, None)
    else:
        path = path_of(store, job_id, cluster)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def save(store: Path, report: Report) -> Path:
    path = path_of(store, report.job.job_id, report.job.cluster or None)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        out.write(to_json(report, compact=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path
