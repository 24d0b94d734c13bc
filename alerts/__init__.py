"""Prometheus recording and alerting rules for Lockstep (see docs/alerting.md).

The rules are written in one module per area, listed by alerts/rules.py, with thresholds from
lockstep/thresholds.py, and rendered to the checked-in rule files by `python -m alerts --write`.
This package is not part of the installed agent: run it from the repository root.
"""
