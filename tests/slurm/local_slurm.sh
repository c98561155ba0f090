#!/usr/bin/env bash
# A private single-node SLURM cluster in a work folder, for tests and for
# trying scripts/vtrain.sbatch by hand. Needs root and the Debian packages
# munge, slurmctld, slurmd and slurm-client.
#
#   bash tests/slurm/local_slurm.sh start DIR [CPUS]   start it, print the export to use
#   bash tests/slurm/local_slurm.sh stop DIR           cancel its jobs, stop its daemons
#
# or, from a script: `source tests/slurm/local_slurm.sh`, then
# `local_slurm_start DIR [CPUS]` / `local_slurm_stop DIR`.
#
# Everything lives under DIR: slurm.conf (clients and daemons find it through
# SLURM_CONF, which start exports), state, spool, logs, and a munged of its
# own with its own key and socket, so a system munged or SLURM is left alone
# and two clusters can run side by side (the ports are picked free). The node
# declares max(CPUS, the cores it has) CPUs (SlurmdParameters=config_overrides)
# so a job can ask for more tasks than the machine has cores. A failure
# prints the daemons' logs and returns 1; stop is safe to call at any time and
# more than once.

local_slurm_missing() {  # prints the SLURM/munge programs that are not installed
  local p missing=()
  for p in munged slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
    command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing+=("$p")
  done
  echo "${missing[*]}"
}

_ls_log() { echo "local_slurm: $*" >&2; }

# Prints a TCP port that nothing listens on, in 20000-32767: below Linux's
# ephemeral range (32768-60999), so no outgoing connection takes it between
# this check and the daemon's bind.
_ls_free_port() {
  local port=$((20000 + RANDOM % 12000)) skip=${1:-0}
  while ss -Htln "sport = :$port" | grep -q . || ((port == skip)); do
    port=$((port + 1))
  done
  echo "$port"
}

# Sends TERM to the process in pid file $1 and waits for it (up to $2 tenths
# of a second), then KILL. Silent if there is no such process.
_ls_stop_pidfile() {
  local file=$1 tenths=$2 pid i
  [ -s "$file" ] || return 0
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < tenths; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  _ls_log "$(basename "$file" .pid) (pid $pid) ignored TERM for $((tenths / 10)) s; killing it"
  kill -KILL "$pid" 2>/dev/null
  return 0
}

# The PIDs of this cluster's slurmstepd processes (those whose environment
# carries SLURM_CONF=$1) and of everything below them.
_ls_stepd_pids() {
  local conf=$1 stat line pid ppid comm rest queue=() found=() all=()
  for stat in /proc/[0-9]*/stat; do
    line=$(<"$stat") 2>/dev/null || continue
    pid=${line%% *}
    comm=${line#*(}
    comm=${comm%)*}
    rest=${line##*) }  # state ppid ...
    rest=${rest#* }
    ppid=${rest%% *}
    all+=("$pid:$ppid")
    if [ "$comm" = slurmstepd ] &&
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$conf"; then
      queue+=("$pid")
    fi
  done
  while ((${#queue[@]})); do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    found+=("$pid")
    for rest in "${all[@]}"; do
      [ "${rest#*:}" = "$pid" ] && queue+=("${rest%%:*}")
    done
  done
  echo "${found[*]}"
}

_ls_dump_logs() {
  local dir=$1 f
  for f in "$dir"/log/*.log "$dir"/munge/munged.log; do
    [ -f "$f" ] || continue
    echo "----- $f (last 30 lines)" >&2
    tail -n 30 "$f" >&2
  done
}

# The settings every private cluster of the tests shares (root, munge's
# socket and the controller's state under DIR, no accounting, cores as the
# unit), one a line, for a slurm.conf written around them.
local_slurm_settings() {
  local dir=$1
  cat <<EOF
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
StateSaveLocation=$dir/ctld
EOF
}

local_slurm_start() {
  local dir=$1 want_cpus=${2:-2}
  [ -n "$dir" ] || { _ls_log "usage: local_slurm_start DIR [CPUS]"; return 2; }
  local missing
  missing=$(local_slurm_missing)
  if [ -n "$missing" ]; then
    _ls_log "not installed: $missing (apt-get install munge slurmctld slurmd slurm-client)"
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    _ls_log "needs root (slurmd and munged run as root/munge)"
    return 1
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  chmod 755 "$dir"  # munged runs as munge and needs to reach $dir/munge
  mkdir -p "$dir/ctld" "$dir/d" "$dir/log"
  install -d -o munge -g munge -m 755 "$dir/munge"

  # munged of our own, with its own key: its socket is named in slurm.conf
  # (AuthInfo), so the daemons and the clients use it and nothing else.
  head -c 1024 /dev/urandom >"$dir/munge/munge.key"
  chown munge:munge "$dir/munge/munge.key"
  chmod 400 "$dir/munge/munge.key"
  runuser -u munge -- "$(command -v munged || echo /usr/sbin/munged)" \
    --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
    --key-file="$dir/munge/munge.key" || { _ls_log "munged did not start"; _ls_dump_logs "$dir"; return 1; }

  local host node cpus ctld_port slurmd_port
  # Addressed as 127.0.0.1: a fresh machine's hostname need not resolve.
  host=$(hostname -s)
  # First line of `slurmd -C`: NodeName=h CPUs=2 Boards=1 SocketsPerBoard=1
  # CoresPerSocket=2 ThreadsPerCore=1 RealMemory=...
  node=$(slurmd -C | head -n 1)
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$node")
  if [ -n "$cpus" ] && ((cpus < want_cpus)); then
    local mem
    mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    node="NodeName=$host CPUs=$want_cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$want_cpus ThreadsPerCore=1 RealMemory=${mem:-1000}"
  fi
  ctld_port=$(_ls_free_port)
  slurmd_port=$(_ls_free_port "$ctld_port")

  cat >"$dir/slurm.conf" <<EOF
# Written by tests/slurm/local_slurm.sh: a private single-node cluster.
ClusterName=vtrain-ci
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
$(local_slurm_settings "$dir")
SlurmdSpoolDir=$dir/d
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$dir/slurm.conf"

  slurmctld -i || { _ls_log "slurmctld did not start"; _ls_dump_logs "$dir"; return 1; }
  slurmd || { _ls_log "slurmd did not start"; _ls_dump_logs "$dir"; return 1; }
  local i state
  for ((i = 0; i < 300; i++)); do  # 30 s
    state=$(sinfo -h -o %T 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    sleep 0.1
  done
  _ls_log "the node did not become idle in 30 s (state: '${state:-none}')"
  _ls_dump_logs "$dir"
  return 1
}

local_slurm_stop() {
  local dir=$1 i jobs
  [ -n "$dir" ] && [ -f "$dir/slurm.conf" ] || return 0
  dir=$(cd "$dir" && pwd)
  export SLURM_CONF="$dir/slurm.conf"
  if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(<"$dir/slurmctld.pid")" 2>/dev/null; then
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 400; i++)); do  # 40 s: KillWait (30 s) and some
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  _ls_stop_pidfile "$dir/slurmd.pid" 100
  # slurmstepd (and the job's processes) outlive slurmd: stop what is left.
  local pid left
  left=$(_ls_stepd_pids "$dir/slurm.conf")
  for pid in $left; do kill -TERM "$pid" 2>/dev/null || true; done
  for ((i = 0; i < 50 && ${#left}; i++)); do
    sleep 0.1
    left=$(for pid in $left; do kill -0 "$pid" 2>/dev/null && echo "$pid"; done)
  done
  for pid in $left; do
    _ls_log "killing leftover pid $pid ($(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null))"
    kill -KILL "$pid" 2>/dev/null || true
  done
  _ls_stop_pidfile "$dir/slurmctld.pid" 100
  _ls_stop_pidfile "$dir/munge/munged.pid" 100
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  case "${1:-}" in
    start)
      [ -n "${2:-}" ] || { echo "usage: $0 start DIR [CPUS]" >&2; exit 2; }
      local_slurm_start "$2" "${3:-2}" || { local_slurm_stop "$2"; exit 1; }
      echo "export SLURM_CONF=$SLURM_CONF"
      ;;
    stop)
      [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }
      local_slurm_stop "$2"
      ;;
    *) sed -n '2,8p' "$0" >&2; exit 2 ;;
  esac
fi
