"""The suite's fixtures and hooks: tiers by marker, and a machine left as it was found.

Tests live by the code they test (tests/agent/, tests/collectors/<collector>/, tests/alerts/, ...);
a test's tier is what it needs, said by its marker (tests/support/__init__.py TIERS):
    (none)   unit: in-process, on fixture trees, fakes and captured output.  conftest marks it
             `unit` and holds it to that: a unit test that starts a process, or asks for a real
             component (require_real), fails with a message saying to mark it `real`.
    real     real components: processes, root, Debian packages (skips without them; fails
             under CI=true).
    e2e      a Prometheus, Alertmanager or VictoriaMetrics server, or the soak.  Implies `real`.
    machine  changes or reads machine-wide state (mounts, users, network namespaces, cgroups,
             the host's process table).  Implies `real`; never runs beside another test.
./dev/test --quick runs the unit tier (-m unit) on four workers; ./dev/test runs the machine tier
and the e2e runs that watch demos (marked `alone` here) in one process, one test at a time, so no
machine test sees another's mounts, users or processes, and beside it, at the lowest priority,
every other test on two workers (MachineTier keeps the two runs' machine checks apart).

Shared helpers live in tests/support/ (`from tests.support import samples`); no test module
imports another (tests/project/test_suite.py checks).
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import GOLDEN, TESTS, UNIT_TEST_RUNNING, AgentProcess, observation, require_real
from tests.support import report_run as scenarios_at_own_timing
from tests.support.prometheus import PROMETHEUS
from tests.support.session import MachineTier, MadeAhead, machine_tier_first
from tests.support.training_replay import WrittenReplays

# The environment variable every process the tests start inherits: what is still running at the
# end with it is a process the tests left behind.
RUN_TOKEN = "LOCKSTEP_TEST_RUN"
# Services of the Debian packages the tests use (dev/debian-packages.d/): installed neither
# started nor enabled by dev/setup.sh, and the tests start their own.
UNITS = (
    "prometheus",
    "prometheus-node-exporter",
    "prometheus-alertmanager",
    "munge",
    "slurmctld",
    "slurmd",
    "victoria-metrics",
)
# What the tests may leave in pytest's base temporary directory at the end (module-scoped
# directories live until the session ends; a passed test's tmp_path is removed at once).  The
# e2e runs' Prometheus, VictoriaMetrics and demo logs are most of it: 53 MB in the full run at
# 6a0ce6e (scale-out 26, alerts 21, pages 3), past the 50 MiB this was, once the scale-out run
# watched gpu-faults and gpu-throttle too.
BASETEMP_LIMIT = 64 * 1024 * 1024


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from the current output")
    parser.addoption(
        "--no-machine-check",
        action="store_true",
        help="do not check that the run left the machine as it found it (another run on the same machine "
        "at the same time shows there too)",
    )


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(RUN_TOKEN, secrets.token_hex(8))
    config.addinivalue_line(
        "markers",
        "alone: given by tests/conftest.py to the machine tier and the e2e runs that watch demos (DEMOS): "
        "./dev/test runs them one at a time, beside the others' run on two workers at the lowest priority",
    )


# The shared runs (session fixtures below) and the modules whose tests read them.  On two workers
# (./dev/test: pytest-xdist, --dist loadscope) each module's tests go to one worker, so that its
# module-scoped fixtures (a Prometheus, a backfilled fleet) are made once; the modules that read
# one shared run go together, so that it is made once.  The runs that watch demos on a real
# Prometheus (DEMOS) are marked `alone`, as the machine tier is: ./dev/test runs them one test at
# a time in a run of their own, at the normal priority, beside the other tests' two workers at the
# lowest (their alerts' timing is what they prove; and the alerts' 35 demos hold most of the
# machine's default 128 inotify instances: on a worker beside other tests a demo failed to
# start, "inotify instance limit reached", before the run raised the limit).
# pytest_collection_modifyitems fails a test that reads a shared run from a module not listed here.
DEMOS = "demos on a real Prometheus"
SHARED_RUNS = {
    "alerts_run": ("tests/alerts/test_alerts_e2e.py", "tests/simulation/test_scale_out_e2e.py"),
    "report_run": (
        "tests/report/test_report_e2e.py",
        "tests/project/test_new_report_section_recipe.py",
        "tests/alerts/test_hangs_e2e.py",
    ),
    "written_replays": ("tests/alerts/test_straggler_real_timing.py", "tests/report/test_report_ddp_runs.py"),
}
SCOPES = {
    **{module: DEMOS for run in ("alerts_run", "report_run") for module in SHARED_RUNS[run]},
    "tests/alerts/test_pages_e2e.py": DEMOS,
    **{module: "written_replays" for module in SHARED_RUNS["written_replays"]},
}


def _scope(module: str) -> str:
    """What pytest-xdist hands to one worker: the module's shared run, or the module itself."""
    return SCOPES.get(module, module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist loadscope with the scopes above: a test's module, or the group it belongs to."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid.split("::", 1)[0])

    return SharedRunScheduling(config, log)  # type: ignore[arg-type]


def _module(item: pytest.Item) -> str:
    """The test's module as SCOPES and SHARED_RUNS name it (tests/...), or "" outside tests/."""
    path = item.path.resolve()
    return path.relative_to(TESTS.parent).as_posix() if path.is_relative_to(TESTS) else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's tier from its markers: e2e and machine imply real; a test with none is unit."""
    for item in items:
        module = _module(item)
        if not module:
            continue
        for run, modules in SHARED_RUNS.items():
            if run in getattr(item, "fixturenames", ()) and module not in modules:
                raise pytest.UsageError(f"{item.nodeid} reads {run}: add {module} to tests/conftest.py SHARED_RUNS")
        marks = {mark.name for mark in item.iter_markers()}
        if marks & {"e2e", "machine"} and "real" not in marks:
            item.add_marker(pytest.mark.real)
        elif not marks & {"real", "e2e", "machine"}:
            item.add_marker(pytest.mark.unit)
        if "machine" in marks or ("e2e" in marks and SCOPES.get(module) == DEMOS):
            item.add_marker(pytest.mark.alone)

    # The modules (or shared runs) with a test of the real tiers first, the unit tier's after:
    # on two workers --dist loadscope hands them out in this order, so the long ones (the recipes,
    # the soak, the benches' short runs, tens of seconds each) start first and the unit tier's
    # short modules fill in at the end, where in the folders' order a long module handed out
    # last kept one worker busy while the other had nothing left.
    real = {_scope(_module(item)) for item in items if item.get_closest_marker("unit") is None}
    items.sort(key=lambda item: 0 if _scope(_module(item)) in real else 1)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A machine test runs alone: beside another test (pytest-xdist's workers) each would see the
    other's mounts, network namespaces or processes."""
    if item.get_closest_marker("machine") is not None and _is_xdist_worker(item.config):
        pytest.fail("marked machine: it runs alone; run it without -n (or leave it out: -m 'not machine')")


def _refuse_process(*args: object, **kwargs: object) -> None:
    raise AssertionError(
        "a unit test started a process: mark it @pytest.mark.real (tests/conftest.py), or keep it in-process"
    )


MACHINE_TIER = MachineTier(MachineTier.PATH)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A machine test holds the machine tier's lock (MachineTier), from its first in a row to the
    last.  A unit test, its fixtures included, starts no process: subprocess and fork refuse
    while it runs."""
    if item.get_closest_marker("machine") is not None:
        MACHINE_TIER.hold()
        try:
            return (yield)
        finally:
            if nextitem is None or nextitem.get_closest_marker("machine") is None:
                MACHINE_TIER.release()
    if item.get_closest_marker("unit") is None:
        return (yield)
    saved = subprocess.Popen._execute_child, os.fork  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = _refuse_process  # type: ignore[attr-defined,assignment]
    os.fork = _refuse_process  # type: ignore[assignment]
    UNIT_TEST_RUNNING.set()
    try:
        return (yield)
    finally:
        UNIT_TEST_RUNNING.clear()
        subprocess.Popen._execute_child, os.fork = saved  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Under --update-golden a test marked `golden` that skips fails instead: its golden files
    were not written, and ./dev/regenerate would otherwise end as if they had been."""
    report = yield
    marker = item.get_closest_marker("golden")
    if report.skipped and marker is not None and item.config.getoption("--update-golden"):
        if not hasattr(report, "wasxfail"):
            report.outcome = "failed"
            report.longrepr = golden_not_written(item, marker, report.longrepr)
    return report


def golden_not_written(item: pytest.Item, marker: pytest.Mark, skipped: object) -> str:
    """What a golden test's skip under --update-golden left unwritten, why, and the fix."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    names = [str((GOLDEN / name.format(**params)).relative_to(TESTS.parent)) for name in marker.args]
    reason = skipped[2] if isinstance(skipped, tuple) else str(skipped)
    return (
        f"{item.nodeid} skipped under --update-golden ({reason.removeprefix('Skipped: ')}), so "
        f"{' and '.join(names)} were not written. Install what it needs and regenerate: as root, "
        "./dev/regenerate installs the Debian packages the goldens need (dev/debian-packages.d/core.txt)."
    )


@pytest.fixture
def agent_process() -> Iterator[type[AgentProcess]]:
    yield AgentProcess


@pytest.fixture(scope="session")
def written_replays(tmp_path_factory: pytest.TempPathFactory) -> WrittenReplays:
    """The real DDP runs of tests/fixtures/training/, each replayed once at its own timestamps for
    every test that reads it (tests/support/training_replay.py WrittenReplays)."""
    return WrittenReplays(tmp_path_factory.mktemp("written-replays"))


@pytest.fixture(scope="session")
def alerts_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[observation.Run]:
    """The simulated node's alert cases on a real Prometheus, and a subset on the scale-out path
    beside it, observed once for tests/alerts/test_alerts_e2e.py and
    tests/simulation/test_scale_out_e2e.py (tests/support/observation.py)."""
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    yield from observation.alerts_run(tmp_path_factory.mktemp("e2e"))


@pytest.fixture(scope="session")
def report_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[scenarios_at_own_timing.Run]:
    """The demo scenarios at their own timing on a real Prometheus, watched once for the reports'
    tests (tests/support/report_run.py); in the run of the `alone` tests, made while the machine
    tier runs (pytest_collection_finish)."""
    require_real("Prometheus server (Debian package prometheus)", os.access(PROMETHEUS, os.X_OK))
    ahead = request.config.stash.get(_REPORT_RUN_AHEAD, None)
    if ahead is not None:
        yield ahead.result()
        ahead.close()
        return
    with scenarios_at_own_timing.report_run(tmp_path_factory.mktemp("report")) as run:
        yield run


# The report's shared run, when made ahead (pytest_collection_finish).
_REPORT_RUN_AHEAD = pytest.StashKey[MadeAhead[scenarios_at_own_timing.Run]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """In a run of one process that holds both the machine tier and tests that read report_run
    (./dev/test's second run, `-m alone`): the machine tier first, and report_run made meanwhile
    in a thread of its own, then its readers, then the rest.  The machine tier's ~75 s take
    little of the 2 cores (its tests wait on Slurm, mounts and the kernel), and the report's
    run is 3.5 minutes of watching 14 demos at their own timing on ~45 % of them (measured
    2026-11-29); one after the other they were ~75 s longer.  A machine test sees the run's
    demos and Prometheus as it sees any process of the host: none of them asserts on processes
    it did not start."""
    config = session.config
    if _is_xdist_worker(config):
        return
    items = session.items
    if any(SCOPES.get(_module(item)) == DEMOS for item in items):
        _raise_inotify_instances(config)
    if config.getoption("numprocesses", None) or config.getoption("collectonly"):
        return

    if not os.access(PROMETHEUS, os.X_OK):
        return  # the readers skip (or fail under CI) in the fixture, as without a run ahead
    if not machine_tier_first(items, "report_run"):
        return
    tmp = config._tmp_path_factory.mktemp("report")  # type: ignore[attr-defined]
    config.stash[_REPORT_RUN_AHEAD] = MadeAhead("report-run", lambda: scenarios_at_own_timing.report_run(tmp))


# --- the machine as found ---


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _users() -> set[str]:
    found = {f"user {line.split(':')[0]}" for line in _read("/etc/passwd").splitlines() if line}
    found |= {f"group {line.split(':')[0]}" for line in _read("/etc/group").splitlines() if line}
    for name in ("/etc/subuid", "/etc/subgid"):
        found |= {f"{name} {line}" for line in _read(name).splitlines() if line}
    return found


def _mounts() -> set[str]:
    counts: dict[str, int] = {}
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        mount = f"{fields[4]} ({fields[fields.index('-') + 1]})"
        counts[mount] = counts.get(mount, 0) + 1
    return {f"{mount} x{n}" if n > 1 else mount for mount, n in counts.items()}


def _listdir(path: str) -> set[str]:
    try:
        return {f"{path}/{name}" for name in os.listdir(path)}
    except OSError:
        return set()


def _units() -> set[str]:
    if not Path("/usr/bin/systemctl").exists() and not Path("/bin/systemctl").exists():
        return set()
    result = subprocess.run(
        ["systemctl", "is-enabled", *UNITS], capture_output=True, text=True, timeout=30, check=False
    )
    return {f"{unit}.service {state}" for unit, state in zip(UNITS, result.stdout.split(), strict=False)}


def _cgroups() -> set[str]:
    found = set()
    for dirpath, _, _ in os.walk("/sys/fs/cgroup"):
        found.add(dirpath)
    return found


def _processes() -> set[str]:
    """Processes started by this run (they carry its token in their environment)."""
    token = f"{RUN_TOKEN}={os.environ[RUN_TOKEN]}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if token in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.add(f"pid {entry.name}: {command[:200]}")
        except OSError:
            continue
    return found


def machine_state() -> dict[str, set[str]]:
    return {
        "users, groups, subordinate ids": _users(),
        "mounts (/proc/self/mountinfo)": _mounts(),
        "network namespaces": _listdir("/run/netns"),
        "network interfaces": _listdir("/sys/class/net"),
        "systemd units of the test packages (systemctl is-enabled)": _units(),
        "cgroups": _cgroups(),
    }


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _largest(path: Path, count: int = 5) -> list[str]:
    sizes = [(_size(entry), entry.name) for entry in path.iterdir() if entry.is_dir()]
    return [f"{name} {size / 1e6:.1f} MB" for size, name in sorted(sizes, reverse=True)[:count]]


# The machine as the run found it, and what the run left changed (in the config's stash).
_BEFORE = pytest.StashKey[dict[str, set[str]]]()
_PROBLEMS = pytest.StashKey[list[str]]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# inotify instances a user may hold.  A node runs one agent, which holds up to 3 (the watchers of
# the training and framework logs, and framework_logs' watch for new job cgroups); the alert
# cases' e2e runs 35 demos on this one machine, past the kernel's default of 128 instances a
# user (their demos failed with "inotify instance limit reached").  As root, a run that selects
# those runs (DEMOS) raises the limit for its own time and puts the value found back at its end;
# a run without them leaves it alone, so that ./dev/test's first run, ending while the second
# still watches its demos, puts back nothing under them.
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_INSTANCES_NEEDED = 1024
_INOTIFY_FOUND = pytest.StashKey[str]()


def _raise_inotify_instances(config: pytest.Config) -> None:
    try:
        found = INOTIFY_INSTANCES.read_text().strip()
        if os.geteuid() == 0 and int(found) < INOTIFY_INSTANCES_NEEDED:
            INOTIFY_INSTANCES.write_text(f"{INOTIFY_INSTANCES_NEEDED}\n")
            config.stash[_INOTIFY_FOUND] = found
    except (OSError, ValueError):
        pass  # (no procfs of ours, a read-only /proc/sys: the tests that need more say so)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the machine as found, once per run: in the process that runs the tests, or with
    pytest-xdist in the controller (each worker sees only its half of the run)."""
    config = session.config
    if _is_xdist_worker(config):
        return
    if config.getoption("--no-machine-check"):
        return
    with MACHINE_TIER.quiet():
        config.stash[_BEFORE] = machine_state()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The run leaves the machine as it found it: no user, mount, network namespace or
    interface, enabled service, cgroup or process of its own, and little in pytest's base
    temporary directory.  Otherwise the run fails (exit status 1) and the summary says what is left."""
    config = session.config
    ahead = config.stash.get(_REPORT_RUN_AHEAD, None)
    if ahead is not None:  # made and never read (a run stopped early, -x): its processes stopped now
        ahead.close()
    if _INOTIFY_FOUND in config.stash:
        INOTIFY_INSTANCES.write_text(config.stash[_INOTIFY_FOUND] + "\n")
    if _BEFORE not in config.stash:
        return
    # pytest keeps its TempPathFactory only on the config (the tmp_path_factory fixture's source).
    basetemp = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    with MACHINE_TIER.quiet():
        problems = machine_changes(config.stash[_BEFORE], basetemp)
    if problems:
        config.stash[_PROBLEMS] = problems
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    problems = config.stash.get(_PROBLEMS, [])
    if problems:
        terminalreporter.section("machine check", red=True)
        terminalreporter.write_line(
            "FAILED: the tests left the machine changed (another run on this machine at the same time shows "
            "here too: --no-machine-check):"
        )
        for problem in problems:
            terminalreporter.write_line(f"  {problem}")


def machine_changes(before: dict[str, set[str]], basetemp: Path) -> list[str]:
    after = machine_state()
    problems = []
    for what, state in after.items():
        added, removed = sorted(state - before[what]), sorted(before[what] - state)
        if added:
            problems.append(f"{what}, new: " + ", ".join(added[:20]) + (" ..." if len(added) > 20 else ""))
        if removed and what.startswith("systemd"):
            problems.append(f"{what}, changed from: " + ", ".join(removed))
    leftover = _processes()
    if leftover:
        problems.append("processes the tests started, still running: " + "; ".join(sorted(leftover)[:20]))
    size = _size(basetemp)
    if size > BASETEMP_LIMIT:
        problems.append(
            f"pytest's base temporary directory {basetemp} holds {size / 1e6:.0f} MB "
            f"(limit {BASETEMP_LIMIT / 1e6:.0f} MB): " + ", ".join(_largest(basetemp))
        )
    return problems
