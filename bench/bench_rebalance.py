#!/usr/bin/python3
"""Online re-balancing on one small box (issue 14's figure of part 3).

Three ranks (rank 0 alone on cpu 0, ranks 1 and 2 sharing cpu 1, as in
bench_hetero.py) train LeNet with balance.split: auto; from step --slow-at
rank 0's compute takes twice as long (VTRAIN_SLOW_*, the tests' knob). The
metrics file records every step (train.log_every=1): per-rank compute time
and split. The script prints throughput in three phases (before the
slowdown, slowed on the old split, after the switch), each against the
ideal bound of its phase: the sum over ranks of batch / compute time at
the measured rates (the exchange left out, so what the bound misses is the
exposed exchange and the wait for the slowest rank), and writes the
per-step table for scripts/plot_rebalance.py.

  /usr/bin/python3 bench/bench_rebalance.py [--vtrain build/vtrain] [--out rebalance.jsonl]
      [--quotas none,0.5,0.3] [--batch 96] [--profile-batches 8,16,...] [--granularity 8]

--quotas runs each rank in a cgroup with that CPU quota (cpu_slices.py,
needs root): ranks 1 and 2 keep fixed speeds on their shared core instead of
taking the core from each other whenever one waits.
"""
import argparse
import os
import shutil
import statistics
import tempfile

from cpu_slices import check_headroom, describe, parse_quotas, quota_cgroups, write_rankfile
from vtrain_metrics import measured_rate, records, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_steps(path):
    """Step records (with wall time per step from the cumulative img/s) and
    rebalance records of a metrics file."""
    switches = records(path, "rebalance")
    steps = [r for r in records(path, "step") if r.get("compute_ms")]
    prev_t = None
    batch = sum(steps[0]["split"])
    # images_per_second is cumulative over timed steps (the first is not timed).
    for i, s in enumerate(steps):
        t = (s["step"] - 1) * batch / s["images_per_second"] if s["images_per_second"] > 0 else None
        s["wall_ms"] = 1000 * (t - prev_t) if t is not None and prev_t is not None else None
        prev_t = t
    return steps, switches


def phase(steps, first, last):
    """Median achieved and ideal throughput (img/s) over steps [first, last)."""
    achieved, ideal = [], []
    for s in steps:
        if first <= s["step"] < last and s["wall_ms"]:
            achieved.append(sum(s["split"]) / s["wall_ms"] * 1000)
            ideal.append(1000 * measured_rate(s))
    return statistics.median(achieved), statistics.median(ideal)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "synthetic-lenet.yaml"))
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--slow-at", type=int, default=200)
    ap.add_argument("--profile-batches", default="8,16,24,32,40,48,56,64,72,80",
                    help="profile.batches: the per-rank batches profiled (cover the split)")
    ap.add_argument("--granularity", type=int, default=8,
                    help="balance.granularity: every rank's batch a multiple of this")
    ap.add_argument("--out", default="rebalance.jsonl", help="the run's metrics file, kept")
    ap.add_argument("--quotas", default="",
                    help="per rank, a CPU quota in a cgroup of its own ('none' for none), e.g. "
                         "none,0.5,0.3: fixed, independent speeds for ranks 1 and 2 (cpu_slices.py)")
    args = ap.parse_args()
    quotas = parse_quotas(args.quotas, 3) if args.quotas else [None] * 3
    if any(quotas):
        print("CPU slices: " + describe(quotas))
        check_headroom(quotas)
    with quota_cgroups(quotas) as prefixes:
        bench(args, prefixes)


def bench(args, prefixes):
    env = dict(os.environ, OMPI_MCA_btl="self,vader", OMPI_MCA_mpi_yield_when_idle="1",
               VTRAIN_SLOW_RANK="0", VTRAIN_SLOW_AT_STEP=str(args.slow_at), VTRAIN_SLOW_FACTOR="2")
    work = tempfile.mkdtemp(prefix="vtrain-rebalance.")
    rankfile = os.path.join(work, "rankfile")
    write_rankfile(rankfile)
    metrics = os.path.join(work, "m.jsonl")
    vtrain = [args.vtrain, "train", args.config, "--progress", "line", "--metrics", metrics,
              "--set", "train.batch=%d" % args.batch, "--set", "train.max_steps=%d" % args.steps,
              "--set", "train.epochs=1",
              "--set", "data.train_size=%d" % (args.batch * args.steps), "--set", "train.log_every=1",
              "--set", "train.evaluate=false", "--set", "device.threads=1",
              "--set", "conv.algorithm=direct", "--set", "balance.split=auto",
              "--set", "profile.db=" + os.path.join(work, "perf.db"),
              "--set", "profile.batches=[%s]" % args.profile_batches,
              "--set", "profile.step_rounds=3",
              "--set", "balance.granularity=%d" % args.granularity]
    # One MPMD line: each rank started in its CPU slice.
    mpirun = [os.path.join(ROOT, "scripts", "mpirun.sh"), "--rankfile", rankfile, "--oversubscribe"]
    for r in range(3):
        mpirun += ([":"] if r else []) + ["-np", "1"] + prefixes[r] + vtrain
    out = run(mpirun, env)
    for line in out.splitlines():
        if line.startswith(("plan: split", "rebalance:")):
            print(line)
    shutil.copy(metrics, args.out)
    steps, switches = read_steps(metrics)
    # The VM's own drifts may switch before the slowdown: the phases turn on
    # the first switch after it.
    after = [r for r in switches if r["step"] > args.slow_at]
    switch_at = after[0]["step"] if after else args.steps + 1
    phases = [("before the slowdown", 10, args.slow_at),
              ("slowed, old split", args.slow_at + 1, switch_at),
              ("after the switch", switch_at + 5, args.steps + 1)]
    for name, first, last in phases:
        if last - first < 3:
            print("%-20s steps %d-%d: too few steps" % (name, first, last - 1))
            continue
        a, i = phase(steps, first, last)
        print("%-20s steps %3d-%3d: %6.0f img/s, ideal bound %6.0f img/s: %3.0f%%"
              % (name, first, last - 1, a, i, 100 * a / i))
    if after:
        print("re-balanced %d step(s) after the slowdown (%d switch(es) before it)"
              % (after[0]["step"] - 1 - args.slow_at, len(switches) - len(after)))
    print("metrics: " + args.out)


if __name__ == "__main__":
    main()
