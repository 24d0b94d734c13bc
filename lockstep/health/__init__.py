"""`lockstep health-check`: is this node fit to run jobs?  One answer for Slurm's
HealthCheckProgram and node-problem-detector's custom plugins (docs/health-check.md).

- verdicts.py: the verdicts, judged on one exposition of the agent (what makes a node unhealthy,
  each threshold in lockstep/thresholds.py);
- check.py: where the exposition comes from (the local agent's /metrics, or one round of the
  collectors when no agent answers), within one deadline, and the outcome's exit status;
- drain.py: `--drain`, the node drained in Slurm with Lockstep's reason, never a node someone
  else drained, never undrained;
- command.py: the command's flags and its run.

Like the report, it is a client: the daemon never imports it (the CLI does, for the command).
"""
