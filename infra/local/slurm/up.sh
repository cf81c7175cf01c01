#!/usr/bin/env bash
# Start a one-host Slurm cluster with three emulated nodes (node1..node3) for tests and the demo.
# Most jobs ask for one or two nodes; the third is where a hot spare allocation goes once a spare
# of the first two took a blamed node's slot (tests/integration/test_slurm_spares.py).
#
# Installs Debian's slurm-wlm + munge if missing, creates the munge key, starts munged, writes its
# own slurm.conf under a scratch directory (SLURM_CONF points there, /etc/slurm is never touched),
# starts slurmctld and one slurmd per node, and waits until `sinfo` shows every node usable.
# Idempotent: with the daemons already up it only verifies them. Run as root (CI runs as root).
# Prints the line to eval: `export SLURM_CONF=...`.
#
#   eval "$(infra/local/slurm/up.sh | tail -n 1)"   # then sinfo, sbatch, aerie submit --backend slurm
#
# Environment: AERIE_SLURM_DIR (scratch dir, default /tmp/aerie-slurm), AERIE_SLURM_CTLD_PORT
# (default 16817), AERIE_SLURM_NODE_PORT (node1's slurmd port, node2 and node3 the next, default 17001),
# AERIE_SLURM_CPUS (CPUs per emulated node, default 2).
set -euo pipefail

DIR="${AERIE_SLURM_DIR:-/tmp/aerie-slurm}"
CTLD_PORT="${AERIE_SLURM_CTLD_PORT:-16817}"
NODE_PORT="${AERIE_SLURM_NODE_PORT:-17001}"
CPUS="${AERIE_SLURM_CPUS:-2}"
NODES=(node1 node2 node3)
CONF="$DIR/slurm.conf"
export SLURM_CONF="$CONF"

say() { echo "slurm-up: $*" >&2; }
# Daemons must not inherit the caller's descriptors: started as `flock LOCK up.sh`, a daemon that
# kept the lock's descriptor would hold the lock for as long as it runs.
close_inherited_fds() {
  local fd
  for fd in /proc/$BASHPID/fd/*; do
    fd="${fd##*/}"
    case "$fd" in 0|1|2|255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
  done
}
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (slurmd and munged need it)"

# --- packages ------------------------------------------------------------------------------------
need=()
for bin in slurmctld slurmd sinfo sbatch srun scontrol squeue sacct scancel; do
  command -v "$bin" >/dev/null 2>&1 || need=(slurm-wlm)
done
command -v munged >/dev/null 2>&1 || need+=(munge)
if [ "${#need[@]}" -gt 0 ]; then
  say "installing ${need[*]} from Debian (about two minutes)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 || die "apt-get update failed"
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >&2 || die "apt-get install slurm-wlm munge failed"
fi

# --- munge -----------------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
  say "creating /etc/munge/munge.key"
  mkdir -p /etc/munge
  if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile=/etc/munge/munge.key
  else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; fi
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  (close_inherited_fds; exec runuser -u munge -- /usr/sbin/munged --force)
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged does not answer"
fi

# --- slurm.conf ------------------------------------------------------------------------------------
HOST="$(hostname -s)"
mkdir -p "$DIR"/{state,spool,log,run,pids}
NEW_CONF="$DIR/slurm.conf.new"
{
  echo "# Written by infra/local/slurm/up.sh: a one-host cluster with three emulated nodes."
  echo "ClusterName=aerie"
  echo "SlurmctldHost=$HOST(127.0.0.1)"
  echo "SlurmctldPort=$CTLD_PORT"
  echo "SlurmdPort=$NODE_PORT"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CryptoType=crypto/munge"
  echo "MpiDefault=none"
  # No cgroups: processes are tracked through their parent chain, which works in a container.
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "ReturnToService=2"
  # scancel: SIGTERM, then SIGKILL after KillWait seconds (the agent's own grace is 10 s).
  echo "KillWait=15"
  echo "MinJobAge=300"
  echo "AccountingStorageType=accounting_storage/none"
  # Finished jobs stay visible to `sacct -c` after slurmctld forgets them.
  echo "JobCompType=jobcomp/filetxt"
  echo "JobCompLoc=$DIR/log/jobcomp.log"
  echo "StateSaveLocation=$DIR/state"
  echo "SlurmdSpoolDir=$DIR/spool/%n"
  echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
  echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
  echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
  echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
  echo "SlurmctldTimeout=30"
  echo "SlurmdTimeout=30"
  port="$NODE_PORT"
  for n in "${NODES[@]}"; do
    echo "NodeName=$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$port CPUs=$CPUS RealMemory=4000 State=UNKNOWN"
    port=$((port + 1))
  done
  echo "PartitionName=debug Nodes=node[1-3] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
} > "$NEW_CONF"

alive() {  # alive NAME: our recorded pid of NAME runs and is that daemon
  local pid
  pid="$(cat "$DIR/pids/$1.pid" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "${1%%-*}"
}

if [ -f "$CONF" ] && ! cmp -s "$NEW_CONF" "$CONF"; then
  say "slurm.conf changed: restarting the cluster"
  "$(dirname "$0")/down.sh" >&2 || true
fi
mv "$NEW_CONF" "$CONF"

# --- daemons ---------------------------------------------------------------------------------------
start() {  # start NAME CMD...: run a daemon in the foreground mode, detached, and record its pid
  local name="$1"; shift
  if alive "$name"; then return 0; fi
  say "starting $name"
  # From /: a daemon's working directory is inherited by every job step (slurmstepd), and the
  # caller's (a checkout in /tmp, say) may be deleted while the cluster keeps running.
  (cd / && close_inherited_fds && exec setsid "$@" >>"$DIR/log/$name.stdout" 2>&1 < /dev/null) &
  echo $! > "$DIR/pids/$name.pid"
}

start slurmctld slurmctld -D -f "$CONF"
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping >/dev/null 2>&1 || die "slurmctld does not answer; see $DIR/log/slurmctld.log: $(tail -n 5 "$DIR/log/slurmctld.log" 2>/dev/null)"
for n in "${NODES[@]}"; do
  start "slurmd-$n" slurmd -D -N "$n" -f "$CONF"
done

# Nodes are usable when every one is idle, mixed or allocated (not down, unknown or not responding).
for _ in $(seq 120); do
  states="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u)"
  usable=$(echo "$states" | awk '$2 ~ /^(idle|mix|alloc|comp)$/' | wc -l)
  [ "$usable" -eq "${#NODES[@]}" ] && break
  # A node left DOWN/DRAIN by an earlier run (e.g. killed slurmd) comes back with RESUME.
  for n in $(echo "$states" | awk '$2 ~ /^(down|drain|drng|fail)/ {print $1}'); do
    scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
  done
  sleep 0.5
done
[ "$usable" -eq "${#NODES[@]}" ] || die "nodes not usable after 60 s: $states; see $DIR/log/"
say "cluster up: $(echo "$states" | tr '\n' ' ')"
echo "export SLURM_CONF=$CONF"
