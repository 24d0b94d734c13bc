"""PCIe collector on a fixture tree laid out as the kernel lays out sysfs.

tests/fixtures/pcie/sys holds (class devices are symlinks into devices/, as on a real host):
- mlx5_0: ConnectX-7 at Gen5 x16 under a Gen5 x16 root port; correctable AER errors, one of
  them on a bit the kernel has no name for (``dev_cor_errs_bit[1]``);
- mlx5_4: an SR-IOV virtual function of mlx5_0 (physfn link; its link reads Unknown / 0);
- mlx5_1: a Gen5 x16 HCA in a Gen4 x8 slot, trained at Gen4 x8: at its maximum;
- mlx5_2: an older kernel's spelling ('5 GT/s', '8 GT/s'), trained at Gen2 x8 of Gen3 x16, no AER files;
- mlx5_5: its current_link_width file is missing;
- rxe0: soft-RoCE, no PCI device;
- nvme0: Gen4 x4 with one nonfatal completion timeout;
- nvme1: on the root bus, answering all ones (speed Unknown, width 63), a garbage aer_dev_fatal;
- nvme2: NVMe over fabrics, its device virtual.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from lockstep.agent.collector import NothingHere
from lockstep.collectors.pcie import PcieCollector
from lockstep.collectors.pcie.sysfs import parse_aer, parse_generation, parse_width
from tests.support import FIXTURES, collected, context

SYSFS = FIXTURES / "pcie" / "sys"


def by_device(samples: dict, device: str) -> dict[str, float]:
    """name (with severity/error labels appended) -> value, for one device."""
    out = {}
    for (name, labels), value in samples.items():
        labels = dict(labels)
        if labels.get("device") == device and name != "lockstep_pcie_device_info":
            extra = "".join(f"[{labels[k]}]" for k in ("severity", "error") if k in labels)
            out[f"{name}{extra}"] = value
    return out


def link(generation: int, max_generation: int, width: int, max_width: int) -> dict[str, float]:
    return {
        "lockstep_pcie_link_generation": generation,
        "lockstep_pcie_link_max_generation": max_generation,
        "lockstep_pcie_link_width_lanes": width,
        "lockstep_pcie_link_max_width_lanes": max_width,
    }


def aer(correctable: int, nonfatal: int, fatal: int) -> dict[str, float]:
    return {
        "lockstep_pcie_aer_errors_total[correctable]": correctable,
        "lockstep_pcie_aer_errors_total[nonfatal]": nonfatal,
        "lockstep_pcie_aer_errors_total[fatal]": fatal,
    }


def test_links_and_aer_counters_match_the_fixture_tree() -> None:
    samples = collected(PcieCollector(context(sys_=SYSFS)))
    assert by_device(samples, "mlx5_0") == {
        **link(5, 5, 16, 16),
        **aer(6, 0, 0),
        "lockstep_pcie_aer_errors_by_type_total[correctable][RxErr]": 2,
        "lockstep_pcie_aer_errors_by_type_total[correctable][BadTLP]": 1,
        "lockstep_pcie_aer_errors_by_type_total[correctable][dev_cor_errs_bit[1]]": 3,
        "lockstep_pcie_skipped_reads_total": 0,
    }
    # A Gen5 x16 card in a Gen4 x8 slot is at the most its link can do.
    assert by_device(samples, "mlx5_1") == {**link(4, 4, 8, 8), **aer(0, 0, 0), "lockstep_pcie_skipped_reads_total": 0}
    # The older kernel's '5 GT/s' / '8 GT/s'; no AER files: no AER series, no error.
    assert by_device(samples, "mlx5_2") == {**link(2, 3, 8, 16), "lockstep_pcie_skipped_reads_total": 0}
    assert by_device(samples, "nvme0") == {
        **link(4, 4, 4, 4),
        **aer(0, 1, 0),
        "lockstep_pcie_aer_errors_by_type_total[nonfatal][CmpltTO]": 1,
        "lockstep_pcie_skipped_reads_total": 0,
    }
    # Missing, 'Unknown' and garbage files: the link (all four values) or that AER file left out, counted.
    assert by_device(samples, "mlx5_5") == {"lockstep_pcie_skipped_reads_total": 1}
    assert by_device(samples, "nvme1") == {
        "lockstep_pcie_aer_errors_total[correctable]": 0,
        "lockstep_pcie_aer_errors_total[nonfatal]": 0,
        "lockstep_pcie_skipped_reads_total": 2,
    }
    info = {
        dict(labels)["device"]: (
            dict(labels)["kind"],
            dict(labels)["pci_address"],
            dict(labels)["upstream_pci_address"],
        )
        for (name, labels), value in samples.items()
        if name == "lockstep_pcie_device_info" and value == 1
    }
    assert info == {
        "mlx5_0": ("infiniband", "0000:01:00.0", "0000:00:01.0"),
        "mlx5_1": ("infiniband", "0000:02:00.0", "0000:00:02.0"),
        "mlx5_2": ("infiniband", "0000:41:00.0", "0000:40:01.1"),
        "mlx5_5": ("infiniband", "0000:41:00.1", "0000:40:01.1"),
        "nvme0": ("nvme", "0000:81:00.0", "0000:80:03.1"),
        "nvme1": ("nvme", "0000:80:05.0", ""),
    }
    # The virtual function, soft-RoCE and NVMe over fabrics have no link of their own: no series at all.
    assert not any(dict(labels).get("device") in ("mlx5_4", "rxe0", "nvme2") for _, labels in samples)


def test_skipped_reads_count_every_round_and_are_logged_once_per_file(caplog: pytest.LogCaptureFixture) -> None:
    collector = PcieCollector(context(sys_=SYSFS))
    with caplog.at_level(logging.WARNING):
        collected(collector)
        samples = collected(collector)
    assert by_device(samples, "nvme1")["lockstep_pcie_skipped_reads_total"] == 4
    assert by_device(samples, "mlx5_5")["lockstep_pcie_skipped_reads_total"] == 2
    reasons = sorted(r.reason.split("/sys/", 1)[1] for r in caplog.records)  # type: ignore[attr-defined]
    assert reasons == [
        "devices/pci0000:40/0000:40:01.1/0000:41:00.1/current_link_width: no such file or directory",
        "devices/pci0000:80/0000:80:05.0/aer_dev_fatal: line 2: expected '<error name> <count>', got 'DLP x'",
        "devices/pci0000:80/0000:80:05.0/current_link_speed: expected '<rate> GT/s', got 'Unknown'",
    ]


def test_doctor_says_which_devices_are_not_read_and_why() -> None:
    note = PcieCollector(context(sys_=SYSFS)).check()
    assert note == (
        "not read: mlx5_4: an SR-IOV virtual function, whose link is its physical function's; "
        "rxe0: no PCI device (a software device such as rxe or siw); "
        "nvme2: its device ctl is not a PCI function; "
        "no AER counters (no AER capability, or a kernel without CONFIG_PCIEAER): mlx5_2, mlx5_5; "
        "attributes that could not be read (see the log): mlx5_5 (1), nvme1 (2)"
    )


def test_an_attribute_that_is_a_directory_or_huge_is_skipped(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    hca = sysfs / "devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    (hca / "max_link_width").unlink()
    (hca / "max_link_width").mkdir()
    (hca / "aer_dev_nonfatal").write_text("RxErr 0\n" * 2000)  # past a sysfs page
    samples = collected(PcieCollector(context(sys_=sysfs)))
    assert by_device(samples, "mlx5_0") == {
        "lockstep_pcie_aer_errors_total[correctable]": 6,
        "lockstep_pcie_aer_errors_total[fatal]": 0,
        "lockstep_pcie_aer_errors_by_type_total[correctable][RxErr]": 2,
        "lockstep_pcie_aer_errors_by_type_total[correctable][BadTLP]": 1,
        "lockstep_pcie_aer_errors_by_type_total[correctable][dev_cor_errs_bit[1]]": 3,
        "lockstep_pcie_skipped_reads_total": 2,
    }


def test_an_upstream_port_without_readable_maxima_leaves_the_devices_own(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    shutil.copytree(SYSFS, sysfs, symlinks=True)
    (sysfs / "devices/pci0000:00/0000:00:02.0/max_link_speed").write_text("Unknown\n")
    samples = collected(PcieCollector(context(sys_=sysfs)))
    assert by_device(samples, "mlx5_1")["lockstep_pcie_link_max_generation"] == 5
    assert by_device(samples, "mlx5_1")["lockstep_pcie_link_max_width_lanes"] == 16


def test_nothing_here_without_hcas_or_nvme(tmp_path: Path) -> None:
    with pytest.raises(NothingHere, match="no InfiniBand/RDMA or NVMe devices on this machine"):
        collected(PcieCollector(context(sys_=tmp_path)))
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    (tmp_path / "class" / "infiniband" / "rxe0").mkdir()
    with pytest.raises(NothingHere, match=r"no PCIe function with a link of its own .*rxe0: no PCI device"):
        collected(PcieCollector(context(sys_=tmp_path)))


@pytest.mark.parametrize(
    ("text", "generation"),
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("2.5 GT/s", 1),  # before Linux 5.7
        ("5 GT/s", 2),
        ("8 GT/s", 3),
        ("16 GT/s", 4),
    ],
)
def test_speed_to_generation(text: str, generation: int) -> None:
    assert parse_generation(text) == generation


@pytest.mark.parametrize("text", ["Unknown", "Unknown speed", "20.0 GT/s PCIe", "GT/s", "fast GT/s", ""])
def test_speeds_that_are_no_generation_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_generation(text)


def test_widths() -> None:
    assert [parse_width(w) for w in ("1", "2", "4", "8", "12", "16", "32")] == [1, 2, 4, 8, 12, 16, 32]
    for bad in ("0", "63", "x16", "-8", ""):
        with pytest.raises(ValueError, match="expected a lane count"):
            parse_width(bad)


def test_aer_file_parsing() -> None:
    text = "RxErr 2\ndev_cor_errs_bit[1] 3\nBadTLP 1\nTOTAL_ERR_COR 6\n"
    assert parse_aer(text, "TOTAL_ERR_COR") == (6, {"RxErr": 2, "dev_cor_errs_bit[1]": 3, "BadTLP": 1})
    with pytest.raises(ValueError, match="no TOTAL_ERR_FATAL line"):
        parse_aer("DLP 0\n", "TOTAL_ERR_FATAL")
    with pytest.raises(ValueError, match="line 2: TOTAL_ERR_COR belongs in another AER file"):
        parse_aer("DLP 0\nTOTAL_ERR_COR 0\nTOTAL_ERR_FATAL 0\n", "TOTAL_ERR_FATAL")
    with pytest.raises(ValueError, match="line 1: expected '<error name> <count>'"):
        parse_aer(f"DLP {2**64}\nTOTAL_ERR_FATAL 0\n", "TOTAL_ERR_FATAL")
