#!/usr/bin/python3
"""The input rate in the split (issue 42's third figure): two CPU ranks train
LeNet on synthetic data, rank 1's input throttled to --limit images/s
(VTRAIN_INPUT_RATE_LIMIT), so that its input, not its compute, sets its pace.
The throttle stands in for "1 decoding worker against 4" until the image
pipeline lands: a producer at that rate into a queue of 2 batches, as a
decoding pool of that rate would deliver.

Runs alternate between the input-aware split (balance.input_aware: true) and
the compute-only split (false), --runs of each, on one perf DB profiled by a
first, uncounted run; online re-balancing is off, so each run keeps the split
it started with; the exchange is measured and priced (balance.allreduce:
measure, the default). For each: the split, the plan's predicted step, and the
median step time over the steps after --skip (rank 0's step_ms in the
metrics file: the whole step, the wait for the slowest rank included).

  /usr/bin/python3 bench/bench_input_rate.py [--vtrain build/vtrain] [--limit 120]
      [--batch 96] [--steps 40] [--runs 3]
"""
import argparse
import os
import statistics
import tempfile

import yaml

from vtrain_metrics import records, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(args, work, aware, tag):
    """One run; returns (split, predicted step ms, median measured step ms)."""
    plan_path = os.path.join(work, f"plan-{tag}.yaml")
    metrics = os.path.join(work, f"metrics-{tag}.jsonl")
    env = dict(os.environ, VTRAIN_INPUT_RATE_LIMIT=f"1:{args.limit}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [os.path.join(ROOT, "scripts/mpirun.sh"), "--oversubscribe", "--bind-to", "none", "-np", "2",
           args.vtrain, os.path.join(ROOT, "configs/synthetic-lenet.yaml"), "--progress", "line",
           "--metrics", metrics,
           "--set", "train.evaluate=false", "--set", "conv.algorithm=direct", "--set", "device.threads=1",
           "--set", "train.epochs=100", "--set", f"train.batch={args.batch}",
           "--set", f"train.max_steps={args.steps}", "--set", "train.log_every=1",
           "--set", "balance.split=auto", "--set", "balance.granularity=4",
           "--set", "balance.rebalance.enabled=false",
           "--set", f"balance.input_aware={'true' if aware else 'false'}",
           "--set", f"profile.db={os.path.join(work, 'perf.db')}",
           "--set", f"output.plan={plan_path}"]
    run(cmd, env=env)
    with open(plan_path) as f:
        plan = yaml.safe_load(f)
    steps = [r for r in records(metrics, "step") if r["step"] > args.skip]
    split = [r["batch"] for r in plan["ranks"]]
    binds = [r.get("binds", "-") for r in plan["ranks"]]
    # Each rank's compute (the re-balancer's per-step times), against the
    # plan's prediction of it: what a busy machine adds shows here.
    compute = [statistics.median(s["compute_ms"][r] for s in steps) for r in range(len(split))]
    return split, binds, plan["predicted_step_ms"], statistics.median(s["step_ms"] for s in steps), compute


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtrain", default=os.path.join(ROOT, "build/vtrain"))
    ap.add_argument("--limit", type=float, default=120, help="rank 1's input, images/s")
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of the median")
    ap.add_argument("--runs", type=int, default=3, help="runs of each split")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        train(args, work, True, "profile")  # fills the perf DB; not counted
        results = {True: [], False: []}
        for i in range(args.runs):
            for aware in ((True, False) if i % 2 == 0 else (False, True)):
                results[aware].append(train(args, work, aware, f"{aware}-{i}"))
    print("| split | per-rank batch | binds | predicted step ms | measured step ms (median of each run) | median "
          "| compute ms per rank (median, first run) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    medians = {}
    for aware in (True, False):
        rows = results[aware]
        medians[aware] = statistics.median(r[3] for r in rows)
        name = "input-aware" if aware else "compute-only"
        print(f"| {name} | {'+'.join(map(str, rows[0][0]))} | {', '.join(rows[0][1])} | "
              f"{rows[0][2]:.1f} | {', '.join(f'{r[3]:.1f}' for r in rows)} | {medians[aware]:.1f} | "
              f"{', '.join(f'{c:.1f}' for c in rows[0][4])} |")
    print(f"\ncompute-only / input-aware step: {medians[False] / medians[True]:.2f}x")
    for aware in (True, False):
        predicted = results[aware][0][2]
        print(f"{'input-aware' if aware else 'compute-only'}: predicted {predicted:.1f} ms, measured "
              f"{medians[aware]:.1f} ms ({100 * (medians[aware] / predicted - 1):+.1f}%)")


if __name__ == "__main__":
    main()
