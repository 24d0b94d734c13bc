"""Grafana dashboards for Lockstep, written with grafanalib (see docs/alerting.md).

dashboards/build.py defines them; `python -m dashboards --write` renders the checked-in JSON
and the Kubernetes ConfigMaps.  Not part of the installed agent: run it from the repository root.
"""
