"""The fake NVML's spec (demo, tests): a bad spec is refused with each problem named by file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstep.agent import cli

# --- the fake NVML's spec (demo, tests): named errors, bounded ---


@pytest.mark.parametrize(
    "spec,problem",
    [
        (
            "gpus:\n  - processes:\n      - pid: -1\n",
            "{f}:3: gpus[0].processes[0].pid: expected a whole number of at least 0, got -1",
        ),
        (
            'gpus:\n  - processes:\n      - pid: "x"\n',
            "{f}:3: gpus[0].processes[0].pid: expected a whole number of at least 0, got 'x'",
        ),
        ("gpus: 100000000\n", "{f}:1: gpus: expected a list of GPUs or a number of GPUs up to 1024, got 100000000"),
        (
            "gpus:\n  - power_watts: .nan\n",
            "{f}:2: gpus[0].power_watts: expected a number from 0 to 2**64 - 1, got nan",
        ),
        (
            "gpus:\n  - power_watts: .inf\n",
            "{f}:2: gpus[0].power_watts: expected a number from 0 to 2**64 - 1, got inf",
        ),
        (
            "gpus:\n  - pci_bus_id: 'not a bus'\n",
            "{f}:2: gpus[0].pci_bus_id: expected a PCI bus id such as 00000000:18:00.0, got 'not a bus'",
        ),
    ],
    ids=["pid -1", "pid x", "1e8 gpus", "nan", "inf", "pci bus id"],
)
def test_a_bad_fake_nvml_spec_is_named_by_line(
    tmp_path: Path, spec: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gpus.yml"
    path.write_text(spec)
    assert cli.main(["once", "--gpu.fake-nvml", str(path)]) == 2
    assert capsys.readouterr().err == f"lockstep: --gpu.fake-nvml: {problem.format(f=path)}\n"
