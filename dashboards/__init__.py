"""Grafana dashboards for Lockstep, written with grafanalib (see docs/alerting.md).

dashboards/boards/ defines them, one module each, and dashboards/build.py lists them;
`python -m dashboards --write` renders the checked-in JSON and the Kubernetes ConfigMaps.
Not part of the installed agent: run it from the repository root.
"""
