#!/usr/bin/python3
"""A precision per rank on the CPU (issue 45): a 2-rank job with one rank in
fp32 and one in bf16 against the same job all in fp32 and all in bf16,
LeNet on Fashion-MNIST (configs/fmnist-lenet.yaml).

  /usr/bin/python3 bench/bench_precision_per_rank.py [--vtrain build/vtrain]
      [--rounds 3] [--steps 100] [--epochs 1] [--threads 1]

Three parts, each printed as a markdown table:

  throughput  --rounds rounds; in each the three jobs run --steps steps one
              after another (alternating, so a busy spell of the machine
              hits all alike); the median step (global batch over the
              end record's images/s) per job and its ratio to all-fp32
  accuracy    each job trains --epochs epochs; the test accuracy after the
              last, and its distance from all-fp32's in points
  split       the mixed job (and, for comparison, all-fp32) with
              balance.split: auto (each rank profiled in its own precision
              into a fresh perf DB): the plan's predicted step against the
              measured median step of every step record after the first
              (train.log_every 1)

Every run sets VTRAIN_EMULATE_HALF=1 so that the same command runs on any
CPU: where the CPU lacks native bf16 (AVX2 only) the bf16 rank is the
test-only emulation (bf16 storage, f32 compute, an f32 copy of every half
tensor per op; worker/device/test_only/half_emulation.h), so its
throughput measures the emulation, not bf16 hardware; the accuracy and
the split's prediction are what this figure is for there. On a CPU with
AVX-512 BF16 or AMX the bf16 rank computes natively.
"""
import argparse
import os
import statistics
import tempfile

from vtrain_metrics import end_record, records, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {"fp32": "[fp32, fp32]", "mixed": "[fp32, bf16]", "bf16": "[bf16, bf16]"}


def train(args, precision, extra):
    """Runs a 2-rank job in `precision` (a train.precision value); returns
    its metrics file's path."""
    metrics = tempfile.mktemp(suffix=".jsonl", dir=args.tmp)
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "--oversubscribe", "-np", "2",
           args.vtrain, "train", os.path.join(ROOT, "configs", "fmnist-lenet.yaml"),
           "--progress", "off", "--metrics", metrics,
           "--set", "train.precision=" + precision,
           "--set", "device.threads=%d" % args.threads,
           "--set", "device.backend=cpu"] + extra
    env = dict(os.environ, VTRAIN_EMULATE_HALF="1")
    run(cmd, env=env)
    return metrics


def step_ms(metrics, batch):
    return 1000.0 * batch / end_record(metrics)["images_per_second"]


def throughput(args):
    steps = {name: [] for name in JOBS}
    for _ in range(args.rounds):
        for name, precision in JOBS.items():
            m = train(args, precision, ["--set", "train.max_steps=%d" % args.steps,
                                        "--set", "train.evaluate=false"])
            steps[name].append(step_ms(m, args.batch))
    print("| job | precision per rank | median step (ms) | images/s | vs all-fp32 | runs (ms) |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = statistics.median(steps["fp32"])
    for name, precision in JOBS.items():
        med = statistics.median(steps[name])
        print("| %s | %s | %.2f | %.0f | %.2fx | %s |" % (
            name, precision, med, 1000.0 * args.batch / med, base / med,
            ", ".join("%.1f" % s for s in steps[name])))


def accuracy(args):
    acc = {}
    for name, precision in JOBS.items():
        m = train(args, precision, ["--set", "train.epochs=%d" % args.epochs])
        acc[name] = 100.0 * end_record(m)["test_accuracy"]
    print("| job | precision per rank | test accuracy after %d epoch%s (%%) | vs all-fp32 (points) |"
          % (args.epochs, "" if args.epochs == 1 else "s"))
    print("| --- | --- | --- | --- |")
    for name, precision in JOBS.items():
        print("| %s | %s | %.2f | %+.2f |" % (name, precision, acc[name], acc[name] - acc["fp32"]))


def split(args):
    print("| job, balance.split auto | split | predicted step (ms) | measured median step (ms) | "
          "error |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.split_jobs.split(","):
        split_of(args, name)


def split_of(args, name):
    plan = os.path.join(args.tmp, name + "-plan.yaml")
    db = os.path.join(args.tmp, name + "-split.db")
    m = train(args, JOBS[name], ["--set", "train.max_steps=%d" % args.steps,
                                    "--set", "train.evaluate=false",
                                    "--set", "train.log_every=1",
                                    "--set", "balance.split=auto",
                                    "--set", "profile.db=" + db,
                                    "--set", "output.plan=" + plan])
    predicted = None
    batches = []
    with open(plan) as f:
        for line in f:
            if line.startswith("predicted_step_ms:"):
                predicted = float(line.split(":", 1)[1])
            if line.strip().startswith("batch:"):
                batches.append(line.split(":", 1)[1].strip())
    measured = statistics.median(r["step_ms"] for r in records(m, "step")[1:])
    print("| %s | %s | %.2f | %.2f | %+.1f%% |" % (
        JOBS[name], " + ".join(batches), predicted, measured,
        100.0 * (predicted - measured) / measured))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="device.threads of each rank")
    p.add_argument("--parts", default="throughput,accuracy,split")
    p.add_argument("--split-jobs", default="mixed,fp32",
                   help="the jobs whose auto split is timed (fp32: the same harness on one "
                        "precision, for comparison)")
    args = p.parse_args()
    args.batch = 64  # configs/fmnist-lenet.yaml's train.batch
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        for part in args.parts.split(","):
            {"throughput": throughput, "accuracy": accuracy, "split": split}[part](args)
            print()


if __name__ == "__main__":
    main()
