#!/usr/bin/python3
"""The input rate in the split (issue 42's third figure): two CPU ranks train
LeNet, one rank's input slower than the other's, so that its input, not its
compute, sets its pace:

- with --images DIR (a folder from make_fmnist_images.py --large N, holding
  train/ and test/): real decoding, JPEG folder -> random-resized crop to
  --shape + flip, rank 0 with --workers' first count of decoding threads and
  rank 1 with the second (data.workers: [1, 4]);
- without: synthetic data, rank 1's input throttled to --limit images/s
  (VTRAIN_INPUT_RATE_LIMIT: a producer at that rate into a queue of 2
  batches, as a decoding pool of that rate would deliver).

Runs alternate between the input-aware split (balance.input_aware: true) and
the compute-only split (false), --runs of each, on one perf DB profiled by a
first, uncounted run; online re-balancing is off, so each run keeps the split
it started with; the exchange is measured and priced (balance.allreduce:
measure, the default). For each: the split, the plan's predicted step, and the
median step time over the steps after --skip (rank 0's step_ms in the
metrics file: the whole step, the wait for the slowest rank included), and
per run each rank's compute and input wait (so that a miss of the
prediction can be told apart: compute slower than profiled, or input).
Each run plans afresh (the exchange is measured at its start), so each
run's step is compared with its own prediction; the error printed is the
median over the runs.

  /usr/bin/python3 bench/make_fmnist_images.py /tmp/fmimg --large 3000
  /usr/bin/python3 bench/bench_input_rate.py --images /tmp/fmimg/large --workers 1,4 \
      [--batch 96] [--steps 40] [--runs 5]
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


def config_and_env(args, work):
    """The config a run starts from (the data and the model) and the
    environment it adds: synthetic data with rank 1 throttled, or the image
    folder decoded on data.workers threads per rank."""
    if not args.images:
        return os.path.join(ROOT, "configs/synthetic-lenet.yaml"), {"VTRAIN_INPUT_RATE_LIMIT": f"1:{args.limit}"}
    path = os.path.join(work, "images.yaml")
    c, h, w = args.shape
    with open(path, "w") as f:
        yaml.safe_dump({
            "model": {"preset": "lenet", "classes": 10},
            "data": {"kind": "imagefolder", "train_dir": os.path.join(args.images, "train"),
                     "test_dir": os.path.join(args.images, "test"), "shape": [c, h, w],
                     "train_transform": {"crop": "random_resized", "flip": True},
                     # Given, so that no run decodes 1000 images for the statistics.
                     "mean": [0.3] * c, "std": [0.3] * c,
                     "workers": [int(n) for n in args.workers.split(",")]},
            "optimizer": {"lr": 0.05, "momentum": 0.9}}, f)
    return path, {}


def train(args, work, aware, tag):
    """One run; returns (split, binds, predicted step ms, median measured
    step ms, per-rank median compute ms, per-rank median input wait ms)."""
    plan_path = os.path.join(work, f"plan-{tag}.yaml")
    metrics = os.path.join(work, f"metrics-{tag}.jsonl")
    config, data_env = config_and_env(args, work)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **data_env)
    cmd = [os.path.join(ROOT, "scripts/mpirun.sh"), "--oversubscribe", "--bind-to", "none", "-np", "2",
           args.vtrain, config, "--progress", "line", "--metrics", metrics,
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
    binds = [f'{r.get("binds", "-")} ({r.get("input_rate", 0):.0f} img/s)' for r in plan["ranks"]]
    # Each rank's compute and input wait (the re-balancer's per-step
    # times), against the plan's prediction: what a busy machine adds, or
    # an input slower than measured, shows here.
    per_rank = range(len(split))
    compute = [statistics.median(s["compute_ms"][r] for s in steps) for r in per_rank]
    waits = [statistics.median(s["input_wait_ms_per_rank"][r] for s in steps) for r in per_rank]
    return (split, binds, plan["predicted_step_ms"], statistics.median(s["step_ms"] for s in steps), compute,
            waits)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtrain", default=os.path.join(ROOT, "build/vtrain"))
    ap.add_argument("--limit", type=float, default=120, help="rank 1's input, images/s (without --images)")
    ap.add_argument("--images", help="a folder with train/ and test/ class folders of JPEGs: real decoding")
    ap.add_argument("--workers", default="1,4", help="with --images: decoding threads of rank 0 and rank 1")
    ap.add_argument("--shape", type=int, nargs=3, default=[3, 32, 32], metavar=("C", "H", "W"),
                    help="with --images: the network's input")
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
    # Every run plans afresh (the exchange is measured at each start), so
    # each run's measured step is compared with its own prediction.
    print("| split | per-rank batch (each run) | binds (input rate), first run | predicted step ms (each run) "
          "| measured step ms (each run) | median measured | median error | compute ms per rank (median, each "
          "run) | input wait ms per rank (median, each run) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    medians, errors = {}, {}
    for aware in (True, False):
        rows = results[aware]
        medians[aware] = statistics.median(r[3] for r in rows)
        errors[aware] = statistics.median(r[3] / r[2] - 1 for r in rows)
        name = "input-aware" if aware else "compute-only"
        per_run = lambda k: "; ".join(", ".join(f"{v:.1f}" for v in r[k]) for r in rows)  # noqa: E731
        print(f"| {name} | {', '.join('+'.join(map(str, r[0])) for r in rows)} | {', '.join(rows[0][1])} | "
              f"{', '.join(f'{r[2]:.1f}' for r in rows)} | {', '.join(f'{r[3]:.1f}' for r in rows)} | "
              f"{medians[aware]:.1f} | {100 * errors[aware]:+.1f}% | {per_run(4)} | {per_run(5)} |")
    print(f"\ncompute-only / input-aware step (medians): {medians[False] / medians[True]:.2f}x")
    for aware in (True, False):
        print(f"{'input-aware' if aware else 'compute-only'}: measured against predicted, median over the runs "
              f"{100 * errors[aware]:+.1f}%")

if __name__ == "__main__":
    main()
