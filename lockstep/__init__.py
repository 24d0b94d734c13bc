"""Lockstep: a per-node observability agent for AI/GPU clusters."""

__version__ = "0.1.0"
