"""What the distribution installs and what each entry point imports.

- The wheel's only top-level import name is ``lockstep``: a user's own ``agent/`` or
  ``collectors/`` package cannot shadow ours, nor ours theirs.
- ``lockstep.emitter`` (imported by training jobs) loads the standard library only.
- The daemon (``run``, ``once``) never imports the simulated node: it is for the demo,
  tests and benchmarks (and ``--gpu.fake-nvml``) only.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO, free_port, http_get, lockstep, wait_until

# Tier: real processes and tools (tests/conftest.py).
pytestmark = pytest.mark.real


def build_wheel(out: Path) -> Path:
    # Offline and without build isolation: the test extra's setuptools builds it.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), "."],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (wheel,) = out.glob("lockstep-*.whl")
    return wheel


def test_the_wheel_installs_one_top_level_package_lockstep(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["lockstep"]
        entry_points = archive.read(top_level.replace("top_level.txt", "entry_points.txt")).decode()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"lockstep"}
    # The repository's top-level folders arrive under lockstep/, files and not links.
    for module in (
        "lockstep/agent/cli.py",
        "lockstep/collectors/host.py",
        "lockstep/collectors/kubernetes/podresources/api_pb2.py",
        "lockstep/simulation/fake_nvml/__init__.py",
        "lockstep/emitter.py",
    ):
        assert module in names
    # Every module of the repository's packages, subpackages too (pyproject lists packages by
    # name, so a new collector package left out of that list would be missing from the wheel).
    sources = {
        f"lockstep/{path.relative_to(REPO).as_posix()}"
        for top in ("agent", "collectors", "simulation")
        for path in (REPO / top).rglob("*.py")
    }
    assert sorted(sources - set(names)) == []
    assert "lockstep = lockstep.agent.cli:entry_point" in entry_points
    assert "host = lockstep.collectors.host:HostCollector" in entry_points


def test_the_emitter_loads_the_standard_library_only() -> None:
    code = (
        "import sys; before = set(sys.modules); import lockstep.emitter; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/", check=True
    )
    loaded = set(result.stdout.split())
    assert {m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names} == {"lockstep", "lockstep.emitter"}


def test_the_emitter_imports_even_where_a_project_has_its_own_agent_and_collectors(tmp_path: Path) -> None:
    for name in ("agent", "collectors"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the user project, not Lockstep')\n")
    result = subprocess.run(
        [sys.executable, "-c", "from lockstep.emitter import StepLog; import lockstep.agent.cli; print('ok')"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr


# The daemon's own entry point, recording at exit every module it had loaded (importtime's
# report misses modules loaded through importlib, as collectors from entry points are).
DAEMON = """
import atexit, sys
atexit.register(lambda: open(sys.argv.pop(1), "w").write("\\n".join(sys.modules)))
from lockstep.agent.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_once_does_not_import_the_simulated_node(tmp_path: Path) -> None:
    record = tmp_path / "modules"
    result = subprocess.run(
        [sys.executable, "-c", DAEMON, str(record), "once"], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.stdout.startswith("# HELP"), result.stderr[-2000:]
    loaded = set(record.read_text().split())
    assert "lockstep.collectors.gpu" in loaded  # every default collector was loaded and ran
    assert not {m for m in loaded if m.startswith("lockstep.simulation")}


def test_run_does_not_import_the_simulated_node(tmp_path: Path) -> None:
    record = tmp_path / "modules"
    port = free_port()
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(record), "run", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        wait_until(lambda: scrape(port) == 200, timeout=30, what="the daemon to serve /metrics")
        daemon.terminate()
        _, stderr = daemon.communicate(timeout=20)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
    assert daemon.returncode == 0, stderr[-2000:]
    loaded = set(record.read_text().split())
    assert "lockstep.collectors.gpu" in loaded
    assert not {m for m in loaded if m.startswith("lockstep.simulation")}


def scrape(port: int) -> int:
    try:
        return http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)[0]
    except OSError:
        return 0


def test_the_demo_still_lists_and_checks_its_scenarios() -> None:
    listing = lockstep("demo", "--help")
    assert "  straggler " in listing.stdout
    refused = lockstep("demo", "--scenario", "nope", "--once")
    assert refused.returncode == 2
    assert "argument --scenario: unknown scenario 'nope' (choose from checkpoint-overdue, checkpoint-stall," in (
        refused.stderr
    )
