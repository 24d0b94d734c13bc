#!/bin/sh
# Slurm epilog: keep the report of a job that ended, whatever its end (completed, failed,
# cancelled, timed out, node failure).  Run it as EpilogSlurmctld (once per job, on the
# controller) in slurm.conf:
#     EpilogSlurmctld=/usr/local/sbin/lockstep-report-epilog.sh
# It writes the report's compact JSON to $LOCKSTEP_REPORT_STORE/<cluster>/<job_id>.json, which
# `lockstep report JOB` then reads first (docs/report.md, "Finished jobs keep their report").
#
# slurmctld runs it as SlurmUser (e.g. slurm), which must be able to run $LOCKSTEP and write the
# store, with an environment of its own making: SLURM_JOB_ID and other SLURM_* variables, no
# PATH, nothing of slurmctld's environment.  So it is configured in /etc/default/lockstep-report
# (LOCKSTEP_REPORT_DEFAULTS names another file, for a run by hand):
#   LOCKSTEP_PROMETHEUS_URL  the query URL (default http://localhost:9090)
#   LOCKSTEP_REPORT_STORE    where reports are kept (default /var/lib/lockstep/reports)
#   LOCKSTEP_CLUSTER         the cluster label, when Prometheus sees several clusters
#   LOCKSTEP_REPORT_DELAY    seconds to wait first, for the job's last scrape (default 30); the job
#                            stays COMPLETING meanwhile
#   LOCKSTEP_REPORT_TIMEOUT  seconds the report may take (default 60: its --timeout); the command
#                            is stopped 15 s later whatever it does (timeout(1), SIGKILL 5 s after
#                            SIGTERM).  So the epilog ends within DELAY + TIMEOUT + 20 s (110 s by
#                            default): PrologEpilogTimeout, when set, must be longer than that
#   LOCKSTEP_REPORT_OPTIONS  further options of `lockstep report`, e.g. --grafana https://grafana.example
#   LOCKSTEP                 the lockstep command (default: lockstep on PATH below), e.g.
#                            /opt/lockstep/bin/lockstep
# It always exits 0, and ends within the bound above whatever Prometheus does: a report that
# could not be made must neither drain the node nor hold the job (without PrologEpilogTimeout,
# Slurm's default, slurmctld waits for an EpilogSlurmctld for ever).  slurmctld discards its output: the reason goes to syslog (tag lockstep-report), and to
# stderr for a run by hand.
defaults="${LOCKSTEP_REPORT_DEFAULTS:-/etc/default/lockstep-report}"
# shellcheck disable=SC1090
[ -r "$defaults" ] && . "$defaults"

PATH="${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
export PATH
job="${SLURM_JOB_ID:-${SLURM_JOBID:-}}"
if [ -z "$job" ]; then
    echo "lockstep-report-epilog: no SLURM_JOB_ID: not run by Slurm?" >&2
    exit 0
fi
fail() {
    logger -t lockstep-report "job $job: $1" 2>/dev/null || true
    echo "lockstep-report-epilog: job $job: $1" >&2
}
# slurmctld ends an epilog that outlives PrologEpilogTimeout with SIGTERM, to its whole process
# group: the sleep or the report's process ends with it, then this says why.  (Not `sleep &
# wait`: run by slurmctld's slurmscriptd, with a trap set, the wait builtin never returns.)
trap 'fail "stopped by SIGTERM before its report was stored (slurmctld: PrologEpilogTimeout shorter than LOCKSTEP_REPORT_DELAY and the report?)"; exit 0' TERM
sleep "${LOCKSTEP_REPORT_DELAY:-30}"
limit="${LOCKSTEP_REPORT_TIMEOUT:-60}"
case "$limit" in
    '' | *[!0-9]* | 0)
        fail "LOCKSTEP_REPORT_TIMEOUT=$limit is not a whole number of seconds above 0: 60 used"
        limit=60
        ;;
esac
set -- report "$job" --save --refresh --timeout "$limit"
[ -n "${LOCKSTEP_PROMETHEUS_URL:-}" ] && set -- "$@" --prometheus "$LOCKSTEP_PROMETHEUS_URL"
[ -n "${LOCKSTEP_REPORT_STORE:-}" ] && set -- "$@" --store "$LOCKSTEP_REPORT_STORE"
[ -n "${LOCKSTEP_CLUSTER:-}" ] && set -- "$@" --cluster "$LOCKSTEP_CLUSTER"
# The report keeps its own deadline (--timeout); timeout(1) is the guard on the whole command
# (the interpreter's start, the store written, and whatever else could hold it).  --foreground:
# it stays in this script's process group, so slurmctld's SIGTERM to the group still reaches
# the report at once (the report starts no process of its own for timeout to miss).
# LOCKSTEP may be a command with arguments (python -m lockstep.agent.cli), and the options
# several words: both split on purpose.
# shellcheck disable=SC2086
message="$(timeout --foreground --kill-after=5 "$((limit + 15))" ${LOCKSTEP:-lockstep} "$@" ${LOCKSTEP_REPORT_OPTIONS:-} 2>&1)"
status=$?
case $status in
    0) ;;
    124 | 137) fail "lockstep report did not end within LOCKSTEP_REPORT_TIMEOUT=$limit s and 15 s more: stopped${message:+ ($message)}" ;;
    *) fail "$message" ;;
esac
exit 0
