#!/usr/bin/env bash
# scripts/vtrain.sbatch on a real single-node SLURM (a private cluster in a
# temporary folder, see local_slurm.sh), training LeNet on synthetic data
# with 2 ranks:
#
#   1. a short job: exit code 0 and the training's "done:" line;
#   2. `scontrol requeue` from outside while it trains (what pre-emption
#      does): the ranks get TERM, checkpoint and exit 3, SLURM requeues, and
#      the second run (SLURM_RESTART_COUNT=1) resumes from that checkpoint
#      and finishes;
#   3. USR1 to the batch shell (what --signal=B:USR1@120 sends before the
#      time limit): the script forwards it, vtrain checkpoints, the script
#      requeues the job itself, and the second run resumes and finishes;
#   4. scancel while it trains: vtrain checkpoints and exits 3, and the job
#      stays cancelled (the script does not requeue it);
#   5. the srun --mpi=pmix launcher (VTRAIN_LAUNCHER=srun): a short job;
#   6. the profile form: both tasks profile into one perf DB;
#   7. requeued onto 3 tasks (scontrol update while it waits): the 3 ranks
#      resume from the 2 ranks' checkpoint with the split solved for them.
#
#   bash tests/slurm/slurm_test.sh VTRAIN_BINARY     (ctest -L slurm)
#
# Needs root and the packages munge, slurmctld, slurmd, slurm-client and
# openmpi-bin. Exit status: 0 passed, 1 failed, 77 skipped (SLURM is not
# installed). Every daemon it starts is stopped on exit, whatever happens.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=tests/slurm/local_slurm.sh
source "$here/local_slurm.sh"

if (($# != 1)) || [ ! -x "$1" ]; then
  echo "usage: $0 VTRAIN_BINARY (an executable vtrain)" >&2
  exit 2
fi
vtrain=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")

missing=$(local_slurm_missing)
if [ -n "$missing" ]; then
  echo "SKIP: SLURM is not installed (missing: $missing); apt-get install munge slurmctld slurmd slurm-client"
  exit 77
fi

# In /tmp, not $TMPDIR: munged runs as the munge user and must reach it.
work=$(mktemp -d /tmp/vtrain-slurm-test.XXXXXX)
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local_slurm_stop "$work"
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'echo "slurm_test: interrupted" >&2; exit 1' INT TERM

now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
t_start=$(now_ms)
since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }  # seconds since $1
log() { echo "slurm_test [$(since "$t_start") s]: $*"; }

failures=0
current=""
fail() {
  echo "FAIL ($current): $*" >&2
  failures=$((failures + 1))
}

# The whole test stays well inside CTest's timeout (600 s) so that the EXIT
# trap, not a kill from outside, always stops the daemons.
budget_s=${VTRAIN_SLURM_TEST_BUDGET:-420}
check_budget() {
  if (($(now_ms) - t_start > budget_s * 1000)); then
    fail "the test ran past its budget of $budget_s s; giving up"
    exit 1
  fi
}

# Prints what helps to see why a job went wrong: its record and its output.
show_job() {
  local jid=$1 out=$2
  echo "----- scontrol show job $jid" >&2
  scontrol show job "$jid" >&2 2>&1 || true
  echo "----- $out" >&2
  cat "$out" >&2 2>/dev/null || true
  echo "-----" >&2
}

# One field of `scontrol show job`, e.g. job_field 12 ExitCode -> 0:0.
job_field() {
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

# Waits (polling every 0.5 s, at most $2 s) until job $1 has left the queue.
wait_gone() {
  local jid=$1 limit=$2 t0
  t0=$(now_ms)
  while [ -n "$(squeue -h -j "$jid" 2>/dev/null)" ]; do
    if (($(now_ms) - t0 > limit * 1000)); then
      fail "job $jid still in the queue after $limit s"
      return 1
    fi
    check_budget
    sleep 0.5
  done
}

# Waits (at most $3 s) until job $1 is in state $2 (per squeue).
wait_state() {
  local jid=$1 want=$2 limit=$3 t0 state
  t0=$(now_ms)
  while :; do
    state=$(squeue -h -j "$jid" -o %T 2>/dev/null)
    [ "$state" = "$want" ] && return 0
    if (($(now_ms) - t0 > limit * 1000)); then
      fail "job $jid not $want after $limit s (state: '${state:-gone}')"
      return 1
    fi
    check_budget
    sleep 0.2
  done
}

# Submits the sbatch script on the synthetic LeNet config with extra vtrain
# options; prints the job id. The output goes to $work/NAME.out.
submit() {
  local name=$1
  shift
  sbatch --parsable --chdir="$work" --output="$work/$name.out" \
    "$repo/scripts/vtrain.sbatch" "$repo/configs/synthetic-lenet.yaml" "$@"
}

# Checks a finished job: state, exit code, restarts, the training's last line.
check_finished() {
  local jid=$1 out=$2 restarts=$3 steps=$4 state code n
  state=$(job_field "$jid" JobState)
  code=$(job_field "$jid" ExitCode)
  n=$(job_field "$jid" Restarts)
  [ "$state" = COMPLETED ] || fail "job $jid state is '$state', not COMPLETED"
  [ "$code" = 0:0 ] || fail "job $jid exit code is '$code', not 0:0"
  [ "$n" = "$restarts" ] || fail "job $jid was restarted ${n:-?} times, not $restarts"
  grep -q "^cluster: 2 ranks" "$out" || fail "the output does not show 2 ranks ('cluster: 2 ranks')"
  grep -q "^done: $steps steps" "$out" || fail "no 'done: $steps steps' line in the output"
}

# Waits (at most 120 s) until job $1 has written a checkpoint into $2;
# sets first_ckpt to it. On failure shows the job (output $3), returns 1.
first_ckpt=""
wait_first_checkpoint() {
  local jid=$1 dir=$2 out=$3 t0 ckpts
  t0=$(now_ms)
  while :; do
    ckpts=("$dir"/ckpt-*.vtc)  # zero-padded step numbers: the last is the newest
    if [ -e "${ckpts[0]}" ]; then
      first_ckpt=${ckpts[-1]}
      return 0
    fi
    if [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ]; then
      fail "job $jid ended before writing a checkpoint"
      show_job "$jid" "$out"
      return 1
    fi
    if (($(now_ms) - t0 > 120000)); then
      fail "no checkpoint in $dir after 120 s"
      show_job "$jid" "$out"
      return 1
    fi
    check_budget
    sleep 0.2
  done
}

# Starts requeued job $1 now once it is pending again: requeued jobs wait
# for a begin time (~120 s). SLURM refuses to start a job in the same
# second its previous run's credential was revoked ("Job credential
# revoked"), hence the pause. $2: an update to make while it waits
# (e.g. "NumTasks=3"), or "".
restart_now() {
  local jid=$1 change=$2
  wait_state "$jid" PENDING 90 || return 1
  sleep 1.2
  if [ -n "$change" ]; then
    # shellcheck disable=SC2086  # $change holds KEY=VALUE words
    scontrol update JobId="$jid" $change || fail "scontrol update JobId=$jid $change failed"
  fi
  scontrol update JobId="$jid" StartTime=now || fail "scontrol update JobId=$jid StartTime=now failed"
}

# Cases 2 and 3: interrupt a training job once it has written a checkpoint,
# by `scontrol requeue` or by USR1 to the batch shell, then check that the
# second run resumed from a checkpoint at least that new and finished.
requeue_case() {
  local how=$1 name=requeue-$1 jid out first_step t0 limit=150
  out=$work/$name.out
  t0=$(now_ms)
  # 12 epochs of 32 steps: long enough to interrupt (10-30 s on 2
  # cores), short enough to finish the rest quickly.
  jid=$(submit "$name" --set train.epochs=12 --set train.log_every=100 \
    --set checkpoint.dir="$work/ckpt-$how" --set checkpoint.every=20) || { fail "sbatch failed"; return; }
  log "$current: job $jid submitted"
  wait_first_checkpoint "$jid" "$work/ckpt-$how" "$out" || return
  first_step=$(basename "$first_ckpt" .vtc)
  first_step=$((10#${first_step#ckpt-}))
  log "$current: first checkpoint at step $first_step ($(since "$t0") s); interrupting by $how"
  if [ "$how" = requeue ]; then
    scontrol requeue "$jid" || fail "scontrol requeue $jid failed"
  else
    scancel --batch --signal=USR1 "$jid" || fail "scancel --batch --signal=USR1 $jid failed"
  fi
  restart_now "$jid" "" || { show_job "$jid" "$out"; return; }
  wait_gone "$jid" "$limit" || { scancel "$jid"; show_job "$jid" "$out"; return; }
  log "$current: job $jid finished in $(since "$t0") s"

  local before=$failures stopped resumed resumed_step
  check_finished "$jid" "$out" 1 384
  grep -q "^vtrain.sbatch: job $jid (restart 1)" "$out" ||
    fail "no second run with SLURM_RESTART_COUNT=1 in the output"
  grep -q "^vtrain.sbatch: vtrain exited with status 3" "$out" ||
    fail "the first run did not end with status 3 (stopped after checkpointing)"
  if [ "$how" = usr1 ]; then
    grep -q "^vtrain.sbatch: requeueing job $jid" "$out" || fail "the script did not requeue the job itself"
  else
    grep -q "^vtrain.sbatch: requeueing job" "$out" && fail "the script requeued a job SLURM was already requeueing"
  fi
  stopped=$(sed -n 's/^vtrain: stopped by a signal after checkpointing \([^;]*\);.*/\1/p' "$out")
  resumed=$(sed -n 's/^resumed from \(.*\) (step \([0-9]*\), epoch [0-9]*)$/\1/p' "$out")
  resumed_step=$(sed -n 's/^resumed from .* (step \([0-9]*\), epoch [0-9]*)$/\1/p' "$out")
  [ -n "$stopped" ] || fail "vtrain did not report a checkpoint written on the signal"
  if [ "$(wc -l <<<"$resumed")" -ne 1 ] || [ -z "$resumed" ]; then
    fail "expected one 'resumed from' line, got: '${resumed:-none}'"
  else
    [ "$resumed" = "$stopped" ] || fail "resumed from '$resumed', not from the signal's checkpoint '$stopped'"
    ((resumed_step >= first_step)) ||
      fail "resumed from step $resumed_step, older than the first checkpoint seen (step $first_step)"
    # The resumed run goes on from there: its "done:" comes after "resumed from".
    local line_resumed line_done
    line_resumed=$(grep -n "^resumed from" "$out" | cut -d: -f1)
    line_done=$(grep -n "^done:" "$out" | tail -n 1 | cut -d: -f1)
    ((${line_done:-0} > line_resumed)) || fail "no 'done:' line after 'resumed from'"
  fi
  ((failures == before)) || show_job "$jid" "$out"
  log "$current: stopped at step ${resumed_step:-?} (first checkpoint $first_step), resumed, finished"
}

# Case 7: elastic resume. 2 ranks checkpoint on `scontrol requeue`; while
# the job waits it is changed to 3 tasks (as a site would move it onto
# more nodes); the 3 ranks resume from that checkpoint with the split solved
# for them, the same global batch and data position, and finish.
elastic_case() {
  local jid out=$work/elastic.out dir=$work/ckpt-elastic t0 limit=150 before
  t0=$(now_ms)
  # 2 epochs of 32 steps; the rest runs on 3 ranks on 2 cores.
  jid=$(submit elastic --set train.epochs=2 --set train.log_every=100 \
    --set checkpoint.dir="$dir" --set checkpoint.every=10) || { fail "sbatch failed"; return; }
  wait_first_checkpoint "$jid" "$dir" "$out" || return
  log "$current: first checkpoint $(basename "$first_ckpt") ($(since "$t0") s); requeueing onto 3 tasks"
  scontrol requeue "$jid" || fail "scontrol requeue $jid failed"
  restart_now "$jid" "NumTasks=3 NumCPUs=3" || { show_job "$jid" "$out"; return; }
  wait_gone "$jid" "$limit" || { scancel "$jid"; show_job "$jid" "$out"; return; }
  log "$current: job $jid finished in $(since "$t0") s"

  before=$failures
  check_finished "$jid" "$out" 1 64
  grep -q "^cluster: 3 ranks" "$out" || fail "the requeued run did not start 3 ranks ('cluster: 3 ranks')"
  grep -q "^vtrain.sbatch: the allocation holds 3 tasks, not the 2 the job was submitted with" "$out" ||
    fail "the script did not follow the allocation's 3 tasks"
  grep -q "^vtrain.sbatch: vtrain exited with status 3" "$out" ||
    fail "the 2-rank run did not end with status 3 (stopped after checkpointing)"
  grep -Eq "^resumed from $dir/ckpt-[0-9]+\.vtc \(step [0-9]+, epoch [12]\); it was written by a run of 2 rank\(s\), this run has 3: batch 64 split 22,21,21 \(was 32,32\), from global sample [0-9]+ of epoch [12]$" "$out" ||
    fail "no 'resumed from' line saying 2 ranks' checkpoint continues on 3 with split 22,21,21"
  ((failures == before)) || show_job "$jid" "$out"
}

log "starting a private SLURM in $work"
# 4 CPUs on the node (even on 2 cores): case 7 grows a job to 3 tasks.
local_slurm_start "$work" 4 || exit 1
export OMPI_MCA_btl=self,vader  # one host; keeps Open MPI off other transports
export VTRAIN_BINARY=$vtrain
log "SLURM is up (SLURM_CONF=$SLURM_CONF)"

# 1. A short job runs to the end.
current="short job"
t0=$(now_ms)
if jid=$(submit short --set train.epochs=1 --set checkpoint.dir="$work/ckpt-short"); then
  if wait_gone "$jid" 180; then
    before=$failures
    check_finished "$jid" "$work/short.out" 0 32
    ((failures == before)) || show_job "$jid" "$work/short.out"
  else
    scancel "$jid"
    show_job "$jid" "$work/short.out"
  fi
else
  fail "sbatch failed"
fi
log "$current: $(since "$t0") s"

# 2. Requeued from outside (pre-emption): TERM, checkpoint, resume.
current="scontrol requeue"
t0=$(now_ms)
requeue_case requeue
log "$current: $(since "$t0") s"

# 3. The time-limit warning: USR1 to the batch shell, the script requeues.
current="USR1 before the time limit"
t0=$(now_ms)
requeue_case usr1
log "$current: $(since "$t0") s"

# 4. scancel: vtrain checkpoints, and the job stays cancelled (the script
# must not requeue it: that would undo the scancel).
current="scancel"
t0=$(now_ms)
if jid=$(submit scancel --set train.epochs=20 --set train.log_every=100 \
  --set checkpoint.dir="$work/ckpt-scancel"); then
  out=$work/scancel.out
  while ! grep -q "^model:" "$out" 2>/dev/null && [ -n "$(squeue -h -j "$jid" 2>/dev/null)" ]; do
    check_budget
    sleep 0.2
  done
  sleep 1  # into the training loop
  scancel "$jid" || fail "scancel $jid failed"
  before=$failures
  while state=$(squeue -h -j "$jid" -o %T 2>/dev/null) && [ -n "$state" ] && [ "$state" != PENDING ]; do
    if (($(now_ms) - t0 > 120000)); then
      fail "job $jid still $state 120 s after scancel"
      break
    fi
    check_budget
    sleep 0.2
  done
  sleep 2  # a requeue by the script would show as PENDING by now
  state=$(job_field "$jid" JobState)
  [ "$state" = CANCELLED ] || fail "job $jid is $state after scancel, not CANCELLED"
  [ "$(job_field "$jid" Restarts)" = 0 ] || fail "job $jid was requeued after scancel"
  grep -q "^vtrain: stopped by a signal after checkpointing $work/ckpt-scancel/ckpt-" "$out" ||
    fail "vtrain did not checkpoint on scancel's TERM"
  grep -q "^vtrain.sbatch: stopped by SLURM after checkpointing; not requeueing" "$out" ||
    fail "the script did not report the stop by SLURM"
  ((failures == before)) || show_job "$jid" "$out"
  [ "$state" = PENDING ] && scancel "$jid"
else
  fail "sbatch failed"
fi
log "$current: $(since "$t0") s"

# 5. srun instead of mpirun.
current="srun launcher"
t0=$(now_ms)
if jid=$(VTRAIN_LAUNCHER=srun submit srun --set train.epochs=1 --set checkpoint.dir="$work/ckpt-srun"); then
  if wait_gone "$jid" 180; then
    before=$failures
    check_finished "$jid" "$work/srun.out" 0 32
    grep -q "^vtrain.sbatch: srun --mpi=pmix " "$work/srun.out" || fail "the job did not launch with srun --mpi=pmix"
    ((failures == before)) || show_job "$jid" "$work/srun.out"
  else
    scancel "$jid"
    show_job "$jid" "$work/srun.out"
  fi
else
  fail "sbatch failed"
fi
log "$current: $(since "$t0") s"

# 6. The profile form: both tasks profile into one perf DB.
current="profile job"
t0=$(now_ms)
if jid=$(sbatch --parsable --chdir="$work" --output="$work/profile.out" \
  "$repo/scripts/vtrain.sbatch" profile "$repo/configs/synthetic-lenet.yaml" --db "$work/perf.db" \
  --set profile.repeats=1 --set 'profile.batches=[32]' --set profile.micro_batches=undivided); then
  if wait_gone "$jid" 180; then
    before=$failures
    state=$(job_field "$jid" JobState)
    [ "$state" = COMPLETED ] || fail "profile job $jid state is '$state', not COMPLETED"
    grep -q "^vtrain.sbatch: .*mpirun.* profile " "$work/profile.out" ||
      fail "the job did not run vtrain profile"
    kernels=$(sqlite3 "$work/perf.db" "select count(*) from kernel_measurements" 2>&1)
    steps=$(sqlite3 "$work/perf.db" "select count(*) from step_measurements" 2>&1)
    ((${kernels:-0} > 0)) 2>/dev/null || fail "no kernel measurements in the perf DB ('$kernels')"
    ((${steps:-0} > 0)) 2>/dev/null || fail "no step measurements in the perf DB ('$steps')"
    ((failures == before)) || show_job "$jid" "$work/profile.out"
  else
    scancel "$jid"
    show_job "$jid" "$work/profile.out"
  fi
else
  fail "sbatch failed"
fi
log "$current: $(since "$t0") s"

# 7. Requeued onto another number of tasks: elastic resume.
current="requeue onto 3 tasks"
t0=$(now_ms)
elastic_case
log "$current: $(since "$t0") s"

if ((failures)); then
  log "$failures check(s) failed"
  exit 1
fi
log "all passed"
