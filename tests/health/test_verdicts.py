"""The health check's verdicts on the demo's expositions (tests/golden/demo-*.prom, the simulated
node's first round as `lockstep demo --once` prints it) and on edits of the healthy one."""

from __future__ import annotations

import re

import pytest

from lockstep.health.check import Status, one_line, outcome_of
from lockstep.health.verdicts import Exposition, judge
from tests.support import GOLDEN
from tests.support.agent_http import exposition

# The scenarios whose first exposition shows a node that needs a repair, and the one line each.
UNHEALTHY = {
    "fabric-faults": "IB port mlx5_1/1 down (DOWN)",
    "gpu-faults": "GPU 4 row remapping failed: replace it",
    "gpu-lost": "GPU 5 lost (fell off the bus) (+1 more)",
    "gpu-recovery": "GPU 4 needs drain and reset (NVML recovery action)",
    "leaf-switch-down": "IB port mlx5_0/1 down (DOWN)",
    "nfs-server-down": "mount /home (nfs4) not answering",
    "pcie-degraded": "HCA mlx5_5 PCIe at Gen4, most Gen5",
}


def outcome(text: str):  # type: ignore[no-untyped-def]
    return outcome_of(judge(Exposition(text)), "agent")


def scenarios() -> list[str]:
    return sorted(p.name.removeprefix("demo-").removesuffix(".prom") for p in GOLDEN.glob("demo-*.prom"))


@pytest.mark.parametrize("scenario", scenarios())
def test_each_scenario_is_unhealthy_for_its_fault_and_healthy_otherwise(scenario: str) -> None:
    result = outcome(exposition(scenario))
    if scenario in UNHEALTHY:
        assert (result.status, result.line) == (Status.UNHEALTHY, UNHEALTHY[scenario])
    else:
        assert result.status == Status.HEALTHY, result.line
        assert re.fullmatch(r"8 GPUs, 10 IB ports, [78] mounts \(agent\)", result.line), result.line


def test_the_details_name_every_finding_with_its_verdict() -> None:
    assert outcome(exposition("gpu-lost")).details == [
        "gpu_lost: GPU 5 lost (fell off the bus)",
        "gpu_xid: GPU 5 XID 79 (1x): needs a reset",
    ]


def replaced(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_a_failed_collector_leaves_its_verdicts_undecided_and_the_node_unknown() -> None:
    text = replaced(exposition("healthy"), 'collector="gpu",state="failed"} 0.0', 'collector="gpu",state="failed"} 1.0')
    text = replaced(text, 'collector="gpu",state="ok"} 1.0', 'collector="gpu",state="ok"} 0.0')
    result = outcome(text)
    assert (result.status, result.line) == (Status.UNKNOWN, "the gpu collector failed: its verdicts undecided")


def test_a_collector_that_has_not_run_yet_is_undecided_too() -> None:
    text = replaced(
        exposition("healthy"),
        'collector="infiniband",state="never_ran"} 0.0',
        'collector="infiniband",state="never_ran"} 1.0',
    )
    text = replaced(text, 'collector="infiniband",state="ok"} 1.0', 'collector="infiniband",state="ok"} 0.0')
    assert outcome(text).line == "the infiniband collector has not run yet: its verdicts undecided"


def test_a_finding_makes_the_node_unhealthy_whatever_is_undecided() -> None:
    text = replaced(
        exposition("gpu-lost"),
        'collector="filesystem",state="failed"} 0.0',
        'collector="filesystem",state="failed"} 1.0',
    )
    result = outcome(text)
    assert (result.status, result.line) == (Status.UNHEALTHY, "GPU 5 lost (fell off the bus) (+1 more)")
    assert result.details[-1] == "undecided: the filesystem collector failed: its verdicts undecided"


def test_a_gpu_collector_stuck_in_nvml_is_a_lost_gpu() -> None:
    text = replaced(exposition("healthy"), 'collector="gpu",state="stuck"} 0.0', 'collector="gpu",state="stuck"} 1.0')
    text = replaced(
        text,
        'lockstep_collector_duration_seconds{collector="gpu"} 0',
        'lockstep_collector_duration_seconds{collector="gpu"} 42.4',
    )
    result = outcome(text)
    assert (result.status, result.line) == (Status.UNHEALTHY, "NVML not answering for 42s (GPU collector stuck)")


def test_a_port_slower_than_its_peers_is_degraded_and_a_disabled_one_is_no_fault() -> None:
    healthy = exposition("healthy")
    rate = 'lockstep_ib_port_rate_bytes_per_second{device="mlx5_3",port="1"} 5e+10'
    assert rate in healthy
    slow = healthy.replace(rate, 'lockstep_ib_port_rate_bytes_per_second{device="mlx5_3",port="1"} 2.5e+010')
    assert outcome(slow).line == "IB port mlx5_3/1 at 200 Gb/s, others 400"
    down = replaced(
        healthy,
        'lockstep_ib_port_state{device="mlx5_2",port="1"} 4.0',
        'lockstep_ib_port_state{device="mlx5_2",port="1"} 1.0',
    )
    assert outcome(down).line == "IB port mlx5_2/1 down (DOWN)"
    disabled = replaced(
        down,
        'lockstep_ib_port_physical_state{device="mlx5_2",port="1"} 5.0',
        'lockstep_ib_port_physical_state{device="mlx5_2",port="1"} 3.0',
    )
    assert outcome(disabled).status == Status.HEALTHY


def test_an_xid_that_needs_a_reset_is_a_fault_and_an_application_xid_none() -> None:
    def with_xid(xid: int) -> str:
        return exposition("healthy") + f'lockstep_gpu_xid_errors_total{{gpu="3",uuid="GPU-3",xid="{xid}"}} 2.0\n'

    assert outcome(with_xid(13)).status == Status.HEALTHY  # graphics engine exception: the application's
    assert outcome(with_xid(94)).status == Status.HEALTHY  # contained ECC error: the application ended
    assert outcome(with_xid(48)).line == "GPU 3 XID 48 (2x): needs a reset"


def test_the_line_is_cut_to_what_node_problem_detector_shows_and_printable() -> None:
    long = one_line(["mount /" + "x" * 100 + " (nfs) not answering", "second"])
    assert len("unhealthy: " + long) == 80 and long.endswith("...")
    responsive = 'lockstep_filesystem_responsive{fstype="nfs4",mountpoint="/home'
    # An escaped newline and a raw escape character (a user's mount point, a terminal's colour).
    text = replaced(exposition("nfs-server-down"), f'{responsive}"}} 0.0', f'{responsive}\\n\x1b[31m"}} 0.0')
    assert outcome(text).line == "mount /home??[31m (nfs4) not answering"


def test_an_exposition_the_parser_refuses_is_named_by_its_line() -> None:
    with pytest.raises(ValueError, match=r"^line 3: "):
        Exposition("# HELP a x\na 1\nc{ 2\n")
