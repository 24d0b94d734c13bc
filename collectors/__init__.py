"""Lockstep's built-in collectors, one module or package each; see agent/collector.py for the protocol."""
