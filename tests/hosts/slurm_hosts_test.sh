#!/usr/bin/env bash
# scripts/vtrain.sbatch across two hosts (tests/hosts/hosts.sh) of a private
# SLURM cluster: slurmctld on the login node, a slurmd in each host
# (NodeName node1, node2), munged beside them.
#
#   1. `sbatch -N 2 --ntasks-per-node=2 scripts/vtrain.sbatch CONFIG`: four
#      ranks, two on each host, train until the first checkpoints;
#   2. node2 is drained and the job requeued (`scontrol requeue`): the ranks
#      checkpoint and stop, and the job, updated to one node and two tasks,
#      resumes on node1 alone from that checkpoint (elastic resume) and
#      finishes.
#
#   bash tests/hosts/slurm_hosts_test.sh VTRAIN_BINARY   (ctest -L hosts)
#
# Needs root, the packages of tests/slurm and what hosts.sh needs. Exit
# status: 0 passed, 1 failed, 77 skipped (saying why). Every daemon, host
# and process it starts is stopped on exit, whatever happens.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
hosts=$here/hosts.sh
# shellcheck source=tests/slurm/local_slurm.sh
source "$repo/tests/slurm/local_slurm.sh"

if (($# != 1)) || [ ! -x "$1" ]; then
  echo "usage: $0 VTRAIN_BINARY (an executable vtrain)" >&2
  exit 2
fi
vtrain=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")

"$hosts" check || exit 77
missing=$(local_slurm_missing)
if [ -n "$missing" ]; then
  echo "SKIP: SLURM is not installed (missing: $missing); apt-get install munge slurmctld slurmd slurm-client"
  exit 77
fi

# In /tmp, not $TMPDIR: munged runs as the munge user and must reach it.
work=$(mktemp -d /tmp/vtrain-slurm-hosts.XXXXXX)
chmod 755 "$work"
mkdir -p "$work/log" "$work/ctld"
export SLURM_CONF=$work/slurm.conf

log() { echo "slurm_hosts_test [$SECONDS s]: $*"; }
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# Runs a SLURM client on the login node (where slurmctld listens).
on_login() { nsenter --net="/run/netns/vtrain-$(cat "$work/hosts/id")-head" -- "$@"; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -f "$work/hosts/id" ]; then
    on_login scancel --full --quiet --user=root 2>/dev/null
    local n
    for n in node1 node2; do _ls_stop_pidfile "$work/slurmd-$n.pid" 30; done
    _ls_stop_pidfile "$work/slurmctld.pid" 50
    local stepd
    stepd=$(_ls_stepd_pids "$SLURM_CONF")
    # shellcheck disable=SC2086
    [ -z "$stepd" ] || kill -KILL $stepd 2>/dev/null
    local id subnet
    id=$(cat "$work/hosts/id")
    subnet=$(cat "$work/hosts/subnet")
    "$hosts" down "$work/hosts" || rc=1
    if ! left=$("$hosts" leftovers "$id" "$subnet"); then
      echo "FAIL: left behind: $left" >&2
      rc=1
    fi
  fi
  _ls_stop_pidfile "$work/munge/munged.pid" 50
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "slurm_hosts_test: interrupted" >&2; exit 1' INT TERM

start_cluster() {
  "$hosts" up "$work/hosts" 2 $$ || return 1
  local subnet
  subnet=$(cat "$work/hosts/subnet")
  install -d -o munge -g munge -m 755 "$work/munge"
  head -c 1024 /dev/urandom >"$work/munge/munge.key"
  chown munge:munge "$work/munge/munge.key"
  chmod 400 "$work/munge/munge.key"
  runuser -u munge -- "$(command -v munged || echo /usr/sbin/munged)" \
    --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" \
    --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
    --key-file="$work/munge/munge.key" || return 1
  # Two CPUs a node, as if each host had two cores (the hosts share this
  # machine's; slurmd -C would see them all).
  local node="CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000"
  cat >"$SLURM_CONF" <<EOF
ClusterName=vtrain-hosts
SlurmctldHost=head($subnet.254)
$(local_slurm_settings "$work")
SlurmdSpoolDir=$work/d-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd-%n.log
NodeName=node1 NodeAddr=$subnet.1 $node State=UNKNOWN
NodeName=node2 NodeAddr=$subnet.2 $node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # slurmctld checks that its host is named as SlurmctldHost says.
  on_login unshare --uts sh -c 'hostname head; exec slurmctld -i' || return 1
  "$hosts" exec "$work/hosts" node1 slurmd -N node1 || return 1
  "$hosts" exec "$work/hosts" node2 slurmd -N node2 || return 1
  local i states
  for ((i = 0; i < 300; i++)); do
    states=$(on_login sinfo -h -N -o '%N=%T' 2>/dev/null | sort | tr '\n' ' ')
    [ "$states" = "node1=idle node2=idle " ] && return 0
    sleep 0.1
  done
  log "the nodes did not become idle in 30 s: '$states'"
  return 1
}

show_logs() {
  local f
  for f in "$work"/log/*.log; do
    echo "----- $f (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
}

job_state() { on_login scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }

# Waits up to $2 seconds for job $1 to reach state $3.
wait_state() {
  local i
  for ((i = 0; i < $2 * 5; i++)); do
    [ "$(job_state "$1")" = "$3" ] && return 0
    sleep 0.2
  done
  return 1
}

if ! start_cluster; then
  fail "the cluster did not start"
  show_logs
  exit 1
fi
log "slurmctld on the login node, slurmd on node1 and node2"

ckpt=$work/ckpt
out=$work/job.out
job=$(cd "$repo" && VTRAIN_BINARY=$vtrain on_login sbatch --parsable -N 2 --ntasks-per-node=2 \
  --output="$out" scripts/vtrain.sbatch tests/configs/smooth-lenet.yaml \
  --set train.batch=48 --set train.max_steps=150 --set train.epochs=100 \
  --set train.evaluate=false --set conv.algorithm=direct --set device.threads=1 \
  --set checkpoint.every=10 --set "checkpoint.dir=$ckpt")
log "job $job submitted across 2 nodes"

# Trains on both hosts until a checkpoint is written.
for ((i = 0; i < 600; i++)); do
  ls "$ckpt"/ckpt-*.vtc >/dev/null 2>&1 && break
  sleep 0.2
done
ls "$ckpt"/ckpt-*.vtc >/dev/null 2>&1 || fail "no checkpoint after 120 s"
grep -q ' node1 ' "$out" && grep -q ' node2 ' "$out" ||
  fail "the ranks are not on both hosts: $(grep -A5 '^cluster:' "$out")"

# node2 goes; the job is requeued onto node1 alone.
on_login scontrol update NodeName=node2 State=DRAIN Reason=lost
on_login scontrol requeue "$job"
wait_state "$job" 60 PENDING || fail "job $job was not requeued: $(job_state "$job")"
on_login scontrol update JobId="$job" NumNodes=1 NumTasks=2 StartTime=now ||
  fail "could not update job $job to one node"
wait_state "$job" 180 COMPLETED || fail "job $job did not complete on node1: $(job_state "$job")"
log "job $job ended: $(job_state "$job")"

# The first run is stopped by the requeue. (Its exit status is mpirun's
# 205 rather than vtrain's 3: SLURM stops node2's Open MPI daemon too, which
# ends its ranks after their last step; SLURM requeues the job either way.)
grep -q 'restart 0) on node1 with 4 tasks' "$out" || fail "the first run is not 4 tasks"
grep -q 'got SIGTERM: asking vtrain to checkpoint and stop' "$out" ||
  fail "the first run was not stopped by the requeue"
grep -q 'restart 1) on node1 with 2 tasks' "$out" || fail "the second run is not node1's 2 tasks"
grep -q 'resumed from .*ckpt-.*written by a run of 4 rank(s), this run has 2' "$out" ||
  fail "the second run did not resume the 4 ranks' checkpoint on 2"
grep -q 'done: 150 steps' "$out" || fail "the second run did not finish"
if ((failures)); then
  echo "----- job output" >&2
  cat "$out" >&2
  show_logs
  exit 1
fi
log "passed"
