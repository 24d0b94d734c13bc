"""The notes and the verdict judge by the alert rules' thresholds and never contradict an alert."""

from __future__ import annotations

import dataclasses

from lockstep.report.model import Alert
from lockstep.report.notes import human, notes_for, verdict_for
from tests.support.reports import T0, sample_report


def quiet_report():  # type: ignore[no-untyped-def]
    report = sample_report()
    report.gpus = [dataclasses.replace(report.gpus[0], throttle_seconds={})]
    report.stragglers, report.checkpoints, report.hangs, report.alerts, report.events = [], [], [], [], []
    report.post_mortem = None
    report.steps = dataclasses.replace(report.steps, stalls=[])
    return report


def test_a_quiet_job_gets_the_all_clear() -> None:
    report = quiet_report()
    assert notes_for(report) == [
        "Nothing to report: no straggler, stall, hang, throttling, idle GPU or alert during the job."
    ]
    assert verdict_for(report) == "job 4242 ran 14 h 02 m on 2 nodes, 16 ranks; nothing wrong found."


def test_an_alert_the_report_found_no_cause_for_is_still_said_and_no_all_clear_given() -> None:
    report = quiet_report()
    report.alerts = [Alert("LockstepTrainingStragglerSustained", "warning", T0 + 60, T0 + 600, {"rank": "3"})]
    assert notes_for(report) == [
        "Alert LockstepTrainingStragglerSustained fired 1 time(s), first at 00:01 UTC: see docs/runbooks.md."
    ]
    assert verdict_for(report) == (
        "job 4242 ran 14 h 02 m on 2 nodes, 16 ranks; alerts fired: LockstepTrainingStragglerSustained."
    )


def test_throttling_is_noted_from_the_alerts_share_and_not_below_it() -> None:
    report = quiet_report()
    duration = report.job.duration_seconds
    at = dataclasses.replace(report.gpus[0], throttle_seconds={"hw_thermal_slowdown": 0.25 * duration})
    below = dataclasses.replace(report.gpus[0], throttle_seconds={"hw_thermal_slowdown": 0.24 * duration})
    power_cap = dataclasses.replace(report.gpus[0], throttle_seconds={"sw_power_cap": duration})
    report.gpus = [at]
    assert notes_for(report) == [
        "GPU 5 on n12 was slowed by hw_thermal_slowdown for 25% of the job (the alert's threshold: 25% of its window)."
    ]
    report.gpus = [below, power_cap]
    assert notes_for(report)[0].startswith("Nothing to report")


def test_critical_xids_and_uncorrectable_ecc_are_noted_application_xids_are_not() -> None:
    report = quiet_report()
    report.gpus = [
        dataclasses.replace(report.gpus[0], xid_errors={"48": 1, "13": 4}, ecc_errors={"volatile_uncorrected": 2})
    ]
    assert notes_for(report) == [
        "GPU 5 on n12 reported critical XID 48: it needs attention.",
        "GPU 5 on n12 had 2 uncorrectable ECC error(s).",
    ]


def test_human_durations() -> None:
    assert [human(s) for s in (None, -1, 45, 89, 90, 3599, 5400, 14 * 3600 + 120, 50 * 3600)] == [
        "?",
        "0 s",
        "45 s",
        "89 s",
        "2 min",
        "60 min",
        "1 h 30 m",
        "14 h 02 m",
        "2 d 02 h",
    ]
