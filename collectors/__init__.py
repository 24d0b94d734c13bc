"""Lockstep's built-in collectors, one module each; see agent/collector.py for the protocol."""
