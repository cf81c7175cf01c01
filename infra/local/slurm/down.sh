#!/usr/bin/env bash
# Stop the cluster infra/local/slurm/up.sh started: cancel its jobs, then stop every slurmd and slurmctld.
#
# Uses up.sh's own pid records (slurmd deletes its pid file on exit). munged is left running: it
# holds no state of the cluster and other tools on the machine may use it. The state directory is
# kept unless --purge is given.
set -uo pipefail

DIR="${AERIE_SLURM_DIR:-/tmp/aerie-slurm}"
export SLURM_CONF="$DIR/slurm.conf"
say() { echo "slurm-down: $*" >&2; }

if [ -f "$SLURM_CONF" ] && scontrol ping >/dev/null 2>&1; then
  jobs="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
  if [ -n "${jobs// /}" ]; then say "cancelling jobs $jobs"; scancel $jobs 2>/dev/null || true; fi
fi

stop_pid() {  # stop_pid NAME: SIGTERM our recorded daemon, SIGKILL after 10 s
  local file="$DIR/pids/$1.pid" pid
  pid="$(cat "$file" 2>/dev/null)" || return 0
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "${1%%-*}"; then
    say "stopping $1 (pid $pid)"
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    [ -e "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$file"
}

for f in "$DIR"/pids/slurmd-*.pid; do
  [ -e "$f" ] && stop_pid "$(basename "$f" .pid)"
done
stop_pid slurmctld

if [ "${1:-}" = "--purge" ]; then say "removing $DIR"; rm -rf "$DIR"; fi
exit 0
