"""The report epilog under a real Slurm: slurmctld runs deploy/slurm/lockstep-report-epilog.sh as
its EpilogSlurmctld when each job ends, installed as a site would install it.

A single-node Slurm (tests/support/slurm_cluster.py) with Debian's SlurmUser, ``slurm``: slurmctld
runs the epilog as that user, with an environment of its own making (``SLURM_*`` variables only:
no PATH, no HOME, nothing of slurmctld's), and discards its output.  So the script is configured
the one way it can be, in /etc/default/lockstep-report, which slurmctld (in a mount namespace of
its own) sees in place of the host's; its syslog (/dev/log) is a socket of the test's.  The
script is the shipped one, unchanged (copied, as `install` would).

Its report needs the job's series in Prometheus: the real agent's Slurm collector (1-s interval)
sees the real jobs, and a real Prometheus scrapes it every second.  Each job waits for a file the
test writes once Prometheus holds the job's series (a `sleep 2` may end before its first scrape
on a loaded machine), then ends its own way: completed, failed (exit 3), cancelled while
running; each gets its report stored, which a user then reads without Prometheus.  Then the
ways a report cannot be made: a store the SlurmUser cannot write, Prometheus down, an epilog
that outlives PrologEpilogTimeout; none fails the job or drains the node, and each says why in
syslog.  The report's command is this checkout's lockstep, run by a Python the SlurmUser may
execute (the virtual environment's interpreter may live under /root).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from lockstep import thresholds as T
from lockstep.report import text
from lockstep.report.model import SCHEMA, from_json, to_dict
from tests.support import REPO, AgentProcess, free_port, http_get, require_real, slurm_cluster, wait_until
from tests.support.prometheus import PROMETHEUS, start_prometheus, stop_all

# Tier: a real Slurm (users, /dev nodes, the host's processes) and a real Prometheus.
pytestmark = [pytest.mark.machine, pytest.mark.e2e]

EPILOG = REPO / "deploy" / "slurm" / "lockstep-report-epilog.sh"
SLURM_USER = "slurm"  # Debian's slurm-wlm makes it; its packaged slurm.conf names it SlurmUser
CLUSTER = "lockstep-test"  # Slurm's ClusterName, and the cluster label Prometheus gives the agent
# How each job ends: its name, its command after the go file appears (None: scancel), Slurm's end.
ENDINGS = {
    "completed": ("exit 0", "COMPLETED", "0:0"),
    "failed": ("exit 3", "FAILED", "3:0"),
    "cancelled": (None, "CANCELLED", "0:15"),
}
# The agent collects every second and Prometheus scrapes every second: a job's series outlive it
# by a collection and a scrape, and a loaded machine delays both.
OUTLIVE = 5.0
EPILOG_TIMEOUT = 2  # PrologEpilogTimeout (seconds) for the epilog that slurmctld stops


@dataclass
class Job:
    job_id: str
    name: str
    go: Path  # the file it waits for before it ends
    seen_at: float = 0.0  # the timestamp of a sample of its series in Prometheus, before it was let end
    slurm: dict[str, str] = field(default_factory=dict)  # `scontrol show job` once the epilog ran
    completing: list[tuple[float, str]] = field(default_factory=list)  # seen COMPLETING: when, the node's state
    samples: dict[str, list[float]] = field(default_factory=dict)  # its series' samples' times, once ended


@dataclass
class Run:
    cluster: slurm_cluster.SlurmCluster
    store: Path
    prometheus: str
    agent: str  # the agent's instance label
    lockstep: Path  # this checkout's lockstep, as any user can run it
    jobs: dict[str, Job] = field(default_factory=dict)
    # `lockstep report JOB` of each ending, Prometheus nowhere; --refresh of the completed one, with
    # Prometheus nowhere and then with it
    reads: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    refreshed_nowhere: subprocess.CompletedProcess[str] | None = None
    refreshed: subprocess.CompletedProcess[str] | None = None
    syslog: list[str] = field(default_factory=list)
    node: str = ""  # `scontrol show node` at the end


def report_cli(command: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`lockstep report` as a user of the cluster (Slurm's second user): not root, not the SlurmUser."""
    return subprocess.run(
        ["runuser", "-u", slurm_cluster.SECOND_USER, "--", str(command), "report", *args],
        capture_output=True, text=True, timeout=120, cwd="/",
    )  # fmt: skip


def write_defaults(etc_default: Path, **settings: str) -> None:
    """/etc/default/lockstep-report as slurmctld's epilog sees it."""
    body = "".join(f"{key}={value}\n" for key, value in settings.items())
    (etc_default / "lockstep-report").write_text(body)


def lockstep_for(user: str, bin_dir: Path) -> Path:
    """A `lockstep` command that ``user`` can run: this checkout's, from the virtual environment's
    site-packages (the editable install included), with an interpreter of the same version that
    the user may execute (-I -S: nothing from the environment, the working directory or the
    system's site-packages)."""
    site = sysconfig.get_paths()["purelib"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    code = f"import site, sys; site.addsitedir({site!r}); sys.argv[0] = 'lockstep'; import lockstep.agent.cli as c"
    for python in dict.fromkeys([os.path.realpath(sys.executable), f"/usr/bin/python{version}"]):
        probe = subprocess.run(
            ["runuser", "-u", user, "--", python, "-I", "-S", "-c", code], capture_output=True, timeout=60, cwd="/"
        )
        if probe.returncode == 0:
            command = bin_dir / "lockstep"
            command.write_text(f'#!/bin/sh\nexec {python} -I -S -c "{code}; c.entry_point()" "$@"\n')
            command.chmod(0o755)
            return command
    require_real(f"a Python {version} with which {user} can run this checkout's lockstep", False)
    raise AssertionError("unreachable")


class Syslog:
    """A datagram socket that takes what `logger` sends to /dev/log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        path.chmod(0o666)  # the SlurmUser's logger writes to it
        self.sock.setblocking(False)
        self.lines: list[str] = []

    def read(self) -> list[str]:
        while True:
            try:
                self.lines.append(self.sock.recv(65536).decode(errors="replace"))
            except BlockingIOError:
                return self.lines

    def close(self) -> None:
        self.sock.close()


def sample_time(url: str, selector: str) -> float | None:
    """The timestamp of the latest sample of ``selector``'s (first) series, None without one."""
    query = urllib.parse.urlencode({"query": f"timestamp({selector})"})
    status, body = http_get(f"{url}/api/v1/query?{query}")
    assert status == 200, body
    result = json.loads(body)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def raw_samples(url: str, job_id: str, at: float) -> dict[str, list[float]]:
    """Each of the job's series (by name) and its samples' timestamps in the 2 minutes before
    ``at``: what the report found the job's range in (for an assertion's message)."""
    query = urllib.parse.urlencode({"query": f'{{job_id="{job_id}"}}[2m]', "time": f"{at:.3f}"})
    status, body = http_get(f"{url}/api/v1/query?{query}")
    if status != 200:
        return {"error": []}
    return {
        r["metric"].get("__name__", "?"): [float(t) for t, _ in r["values"]] for r in json.loads(body)["data"]["result"]
    }


def show_job(cluster: slurm_cluster.SlurmCluster, job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields (MinJobAge keeps a finished job there for 5 minutes)."""
    out = cluster.run("scontrol", "-o", "show", "job", job_id)
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def slurm_time(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()  # local time, whole seconds


def submit(cluster: slurm_cluster.SlurmCluster, root: Path, name: str, then: str | None) -> Job:
    """A job that waits for its go file, then runs ``then`` (None: waits to be cancelled)."""
    go = root / f"go-{name}"
    command = f"while [ ! -e {go} ]; do sleep 0.1; done; {then or 'sleep 3600'}"
    out = cluster.run("sbatch", "--parsable", "--output=/dev/null", "-J", f"epilog-{name}", "--wrap", command)
    return Job(out.strip().split(";")[0], f"epilog-{name}", go)


def wait_ended(cluster: slurm_cluster.SlurmCluster, job: Job, timeout: float = 60) -> None:
    """Until the job is done and its EpilogSlurmctld too: slurmctld keeps it COMPLETING meanwhile.
    Notes when it was seen COMPLETING, and the node's state then."""

    def done() -> bool:
        job.slurm = show_job(cluster, job.job_id)
        if job.slurm["JobState"] == "COMPLETING":
            node = cluster.run("scontrol", "-o", "show", "node", cluster.node)
            job.completing.append((time.time(), node.split("State=", 1)[1].split()[0]))
        return job.slurm["JobState"] not in ("PENDING", "RUNNING", "COMPLETING")

    try:
        wait_until(done, timeout=timeout, step=0.2, what=f"job {job.job_id} ({job.name}) and its epilog to end")
    except AssertionError as exc:
        log = (cluster.root / "log" / "slurmctld.log").read_text(errors="replace")[-3000:]
        raise AssertionError(f"{exc}: {job.slurm.get('JobState')}; slurmctld.log:\n{log}") from None


def epilog_log(run: Run) -> str:
    return (run.cluster.root / "log" / "slurmctld.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    require_real("root and Debian slurm-wlm + munge", slurm_cluster.available())
    require_real("mount namespaces (unshare --mount)", _mount_namespaces())
    require_real(f"the user {SLURM_USER} (Debian slurm-wlm)", _user_exists(SLURM_USER))
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    # Not under pytest's 0700 tmp dir: the SlurmUser and the jobs' users must reach it.
    root = Path(tempfile.mkdtemp(prefix="lockstep-epilog-", dir="/tmp"))
    root.chmod(0o755)
    slurm = pwd.getpwnam(SLURM_USER)
    processes: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        bin_dir = root / "bin"
        bin_dir.mkdir(mode=0o755)
        command = lockstep_for(SLURM_USER, bin_dir)
        epilog = bin_dir / EPILOG.name  # as `install -m 755 deploy/slurm/... /usr/local/sbin/` would
        shutil.copyfile(EPILOG, epilog)
        epilog.chmod(0o755)
        store = root / "store"
        store.mkdir(mode=0o755)
        os.chown(store, slurm.pw_uid, slurm.pw_gid)  # the SlurmUser writes it (docs/report.md)
        etc_default = root / "etc-default"
        etc_default.mkdir(mode=0o755)
        syslog = Syslog(root / "dev-log")
        cleanup.callback(syslog.close)

        cluster = slurm_cluster.start(
            root,
            slurm_user=SLURM_USER,
            conf={"EpilogSlurmctld": str(epilog), "MinJobAge": "300"},
            controller_files={"/etc/default": etc_default, "/dev/log": syslog.path},
        )
        cleanup.callback(cluster.stop)
        agent_config = root / "lockstep.yml"
        agent_config.write_text(yaml.safe_dump({"collectors": {"slurm": {"interval": "1s", "deadline": "10s"}}}))
        agent = cleanup.enter_context(
            AgentProcess(
                *("run", "--collector.disable-defaults", "--collector.slurm", "--config", str(agent_config)),
                env={"SLURM_CONF": cluster.env["SLURM_CONF"]},
            )
        )
        prom_dir = root / "prometheus"
        prom_dir.mkdir()
        target = {"targets": [f"127.0.0.1:{agent.port}"], "labels": {"cluster": CLUSTER}}
        (prom_dir / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [{"job_name": T.AGENT_JOB, "static_configs": [target]}],
                }
            )
        )
        cleanup.callback(stop_all, processes)
        url = start_prometheus(prom_dir, free_port(), processes)
        result = Run(cluster, store, url, f"127.0.0.1:{agent.port}", command)
        settings = {
            "LOCKSTEP": str(command),
            "LOCKSTEP_PROMETHEUS_URL": url,
            "LOCKSTEP_REPORT_STORE": str(store),
            "LOCKSTEP_REPORT_DELAY": "0",
        }
        write_defaults(etc_default, **settings)

        # Three jobs that end their own way, and one whose report cannot be stored.
        for name, (then, _, _) in {**ENDINGS, "unwritable": ("exit 0", "", "")}.items():
            result.jobs[name] = submit(cluster, root, name, then)
        cluster.wait_running([job.job_id for job in result.jobs.values()])
        for job in result.jobs.values():
            job.seen_at = wait_until(
                lambda job=job: sample_time(url, f'lockstep_slurm_job_info{{job_id="{job.job_id}"}}'),
                timeout=30,
                step=0.2,
                what=f"job {job.job_id}'s series in Prometheus",
            )
        for name, (then, _, _) in ENDINGS.items():
            if then is None:
                cluster.run("scancel", result.jobs[name].job_id)
            else:
                result.jobs[name].go.touch()
        for name in ENDINGS:
            wait_ended(cluster, result.jobs[name])

        # Read back by a user (not the SlurmUser, not root) without Prometheus; then recomputed.
        nowhere = f"http://127.0.0.1:{free_port()}"
        for name in ENDINGS:
            job_id = result.jobs[name].job_id
            result.reads[name] = report_cli(command, job_id, "--store", str(store), "--prometheus", nowhere)
        completed = result.jobs["completed"].job_id
        result.refreshed_nowhere = report_cli(
            command, completed, "--store", str(store), "--prometheus", nowhere, "--refresh"
        )
        result.refreshed = report_cli(
            command, completed, "--store", str(store), "--prometheus", url, "--refresh", "--format", "json"
        )

        for name in ENDINGS:
            result.jobs[name].samples = raw_samples(url, result.jobs[name].job_id, time.time())

        # A store the SlurmUser cannot write (root's, 0755): no report, the reason in syslog.
        write_defaults(etc_default, **{**settings, "LOCKSTEP_REPORT_STORE": str(root / "root-store")})
        (root / "root-store").mkdir(mode=0o755)
        result.jobs["unwritable"].go.touch()
        wait_ended(cluster, result.jobs["unwritable"])
        write_defaults(etc_default, **settings)

        # Prometheus down when a job ends: no report, the reason in syslog, the job as it ended.
        stop_all(processes)
        result.jobs["down"] = submit(cluster, root, "down", "exit 0")
        result.jobs["down"].go.touch()
        wait_ended(cluster, result.jobs["down"])

        # An epilog that outlives PrologEpilogTimeout: slurmctld stops it, the job COMPLETING until then.
        with (root / "slurm.conf").open("a") as conf:
            conf.write(f"PrologEpilogTimeout={EPILOG_TIMEOUT}\n")
        cluster.run("scontrol", "reconfigure")
        write_defaults(etc_default, **{**settings, "LOCKSTEP_REPORT_DELAY": "30"})
        result.jobs["stopped"] = submit(cluster, root, "stopped", "exit 0")
        result.jobs["stopped"].go.touch()
        wait_ended(cluster, result.jobs["stopped"])
        # slurmctld counts the epilog done once it sent the SIGTERM; the script's trap writes its
        # line after that, on a loaded machine after the job left COMPLETING (a full run, b2c7dcc:
        # no line read).  So until its line came, or 15 s.
        stopped = f"lockstep-report: job {result.jobs['stopped'].job_id}: "
        deadline = time.monotonic() + 15
        while not any(stopped in line for line in syslog.read()) and time.monotonic() < deadline:
            time.sleep(0.2)
        result.syslog = syslog.read()
        result.node = cluster.run("scontrol", "-o", "show", "node", cluster.node)
        yield result


def _mount_namespaces() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def stored(run: Run, job: Job) -> tuple[Path, str]:
    path = run.store / CLUSTER / f"{job.job_id}.json"
    return path, path.read_text()


def logged(run: Run, job: Job) -> list[str]:
    """What the epilog sent to syslog about the job."""
    return [line for line in run.syslog if f"lockstep-report: job {job.job_id}: " in line]


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_slurmctld_runs_the_epilog_and_it_stores_the_report(run: Run, ending: str) -> None:
    job = run.jobs[ending]
    _, state, exit_code = ENDINGS[ending]
    assert (job.slurm["JobState"], job.slurm["ExitCode"]) == (state, exit_code)
    assert f"epilog_slurmctld JobId={job.job_id} " not in epilog_log(run)  # no timeout, no failure
    assert logged(run, job) == []
    path, body = stored(run, job)
    # Written by the SlurmUser, readable by every user (the login nodes' users read it).
    slurm = pwd.getpwnam(SLURM_USER)
    for made, mode in ((path.parent, 0o755), (path, 0o644)):
        info = made.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (slurm.pw_uid, mode), made
    assert "\n" not in body and body.startswith(f'{{"schema":"{SCHEMA}",')
    report = from_json(body)
    assert to_dict(report) == json.loads(body)  # every field of the schema, nothing else
    got = report.job
    # The job as the real Slurm ran it (the agent's lockstep_slurm_job_info), ended at its last sample.
    assert (got.job_id, got.cluster, got.state) == (job.job_id, CLUSTER, "ended")
    assert (got.user, got.partition, got.job_name, got.nodes) == ("root", "gpu", job.name, [run.agent])
    start, end = slurm_time(job.slurm["StartTime"]), slurm_time(job.slurm["EndTime"])
    assert start - 1 <= got.start <= job.seen_at <= got.end <= end + OUTLIVE, (
        {k: job.slurm.get(k) for k in ("SubmitTime", "EligibleTime", "StartTime", "EndTime", "Restarts", "Reason")},
        (got.start, got.end, job.samples),
        epilog_log(run)[-4000:],
    )
    assert end <= report.generated_at < end + 30  # when the job ended, not at some later time

    # `lockstep report JOB --store STORE` reads it first: Prometheus is nowhere.
    read = run.reads[ending]
    assert (read.returncode, read.stderr) == (0, "")
    assert read.stdout == text.render(report)


def test_refresh_recomputes_from_prometheus(run: Run) -> None:
    job = run.jobs["completed"]
    _, body = stored(run, job)
    kept = from_json(body)
    assert run.refreshed_nowhere is not None and run.refreshed is not None
    assert run.refreshed_nowhere.returncode == 1
    assert run.refreshed_nowhere.stderr.startswith("lockstep: report: cannot reach Prometheus at http://127.0.0.1:")
    assert (run.refreshed.returncode, run.refreshed.stderr) == (0, "")
    fresh = from_json(run.refreshed.stdout)
    assert fresh.generated_at > kept.generated_at
    # The same job, still ended (its report is stored); its series may have had one more scrape.
    assert (fresh.job.job_id, fresh.job.state, fresh.job.start) == (job.job_id, "ended", kept.job.start)
    assert kept.job.end <= fresh.job.end <= slurm_time(job.slurm["EndTime"]) + OUTLIVE
    assert stored(run, job)[1] == body  # the stored one as it was


@pytest.mark.parametrize("failure", ["unwritable", "down"])
def test_a_report_that_cannot_be_made_neither_fails_the_job_nor_drains_the_node(run: Run, failure: str) -> None:
    job = run.jobs[failure]
    assert (job.slurm["JobState"], job.slurm["ExitCode"]) == ("COMPLETED", "0:0")
    assert f"epilog_slurmctld JobId={job.job_id} " not in epilog_log(run)  # exit 0, in time
    assert not (run.store / CLUSTER / f"{job.job_id}.json").exists()
    reason = {
        "unwritable": f"cannot store the report in {run.cluster.root / 'root-store'}: Permission denied",
        "down": f"cannot reach Prometheus at {run.prometheus}: [Errno 111] Connection refused",
    }[failure]
    # slurmctld discards the epilog's stderr: syslog is where the reason goes.
    assert [line.split("lockstep-report: ", 1)[1] for line in logged(run, job)] == [
        f"job {job.job_id}: lockstep: report: {reason}"
    ], run.syslog
    fields = dict(word.split("=", 1) for word in run.node.split() if "=" in word)
    assert (fields["State"], fields.get("Reason")) == ("IDLE", None), run.node


def test_an_epilog_that_outlives_prolog_epilog_timeout_is_stopped_and_says_why(run: Run) -> None:
    job = run.jobs["stopped"]
    assert (job.slurm["JobState"], job.slurm["ExitCode"]) == ("COMPLETED", "0:0")
    assert f"error: epilog_slurmctld JobId={job.job_id} timed out" in epilog_log(run)
    assert not (run.store / CLUSTER / f"{job.job_id}.json").exists()
    assert [line.split("lockstep-report: ", 1)[1] for line in logged(run, job)] == [
        f"job {job.job_id}: stopped by SIGTERM before its report was stored (slurmctld: PrologEpilogTimeout "
        "shorter than LOCKSTEP_REPORT_DELAY and the report?)"
    ], run.syslog
    # Until then the job was COMPLETING, its node free (IDLE once slurmd's part was done); then
    # stopped, not after the 30-s delay.
    end = slurm_time(job.slurm["EndTime"])
    assert job.completing and job.completing[-1][1] == "IDLE", job.completing
    assert not [state for _, state in job.completing if "DRAIN" in state], job.completing
    assert end + EPILOG_TIMEOUT - 1 <= job.completing[-1][0] < end + 20
    fields = dict(word.split("=", 1) for word in run.node.split() if "=" in word)
    assert (fields["State"], fields.get("Reason")) == ("IDLE", None), run.node
