#!/usr/bin/python3
"""Heterogeneity end to end on one small box (issue 5's benchmark).

Three ranks where two share one core and one has a core to itself (an Open
MPI rankfile), so the lone rank is about twice as fast as each of the
others. Every rank profiles in place into one perf DB; then training runs
alternate between the even split and the balancer's split (balance.split:
auto), and the script prints the medians of the measured step times, their
ratio, and the balancer's predicted step time against the measured one.

  /usr/bin/python3 bench/bench_hetero.py [--vtrain build/vtrain] [--rounds 3]

Timings on a shared 2-vCPU VM are noisy: the runs alternate A/B and the
medians are quoted.
"""
import argparse
import os
import re
import statistics
import sys
import tempfile

from vtrain_metrics import end_record, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_ms(metrics_path, batch):
    end = end_record(metrics_path)
    if end["images_per_second"] <= 0:
        sys.exit("no throughput in the end record of " + metrics_path)
    return 1000.0 * batch / end["images_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "synthetic-lenet.yaml"))
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    env = dict(os.environ, OMPI_MCA_btl="self,vader",
               # Ranks 1 and 2 share a core: a rank waiting in MPI must yield it
               # instead of spinning, or it steals the core from the other.
               OMPI_MCA_mpi_yield_when_idle="1")
    work = tempfile.mkdtemp(prefix="vtrain-hetero.")
    rankfile = os.path.join(work, "rankfile")
    with open(rankfile, "w") as f:
        f.write("rank 0=localhost slot=0\nrank 1=localhost slot=1\nrank 2=localhost slot=1\n")
    db = os.path.join(work, "perf.db")
    mpirun = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", "3", "--rankfile", rankfile,
              "--oversubscribe"]
    common = ["--progress", "off",
              "--set", "train.batch=%d" % args.batch, "--set", "train.max_steps=%d" % args.steps,
              "--set", "train.evaluate=false", "--set", "device.threads=1",
              "--set", "conv.algorithm=direct", "--set", "profile.db=" + db,
              "--set", "profile.batches=[8,16,24,32,40,48,56,64,72,80]",
              "--set", "balance.granularity=8", "--set", "balance.candidates=interpolated"]

    print("profiling 3 ranks (rank 0 alone on cpu 0, ranks 1 and 2 sharing cpu 1) ...", flush=True)
    out = run(mpirun + [args.vtrain, "profile", args.config] + common, env)
    print("\n".join("  " + l for l in out.splitlines() if "rank" in l and "share" in l))

    even, balanced, predicted, split_text = [], [], [], None
    for r in range(args.rounds):
        for kind in ("even", "auto"):
            metrics = os.path.join(work, "m-%s-%d.jsonl" % (kind, r))
            plan = os.path.join(work, "plan.yaml")
            extra = ["--set", "balance.split=" + kind, "--metrics", metrics]
            if kind == "auto":
                extra += ["--set", "output.plan=" + plan]
            out = run(mpirun + [args.vtrain, "train", args.config] + common + extra, env)
            ms = step_ms(metrics, args.batch)
            (even if kind == "even" else balanced).append(ms)
            note = ""
            if kind == "auto":
                text = open(plan).read()
                predicted.append(float(re.search(r"^split_ms: ([0-9.e+-]+)", text, re.M).group(1)))
                split_text = re.search(r"plan: split (\S+)", out).group(1)
                allreduce = re.search(r"allreduce of \d+ gradients: ([0-9.]+) ms", out)
                note = " (split %s, predicted %.2f ms%s)" % (
                    split_text, predicted[-1],
                    ", of it allreduce %s ms" % allreduce.group(1) if allreduce else "")
            print("  round %d %-8s %.2f ms/step%s" % (r + 1, kind, ms, note), flush=True)
    e, b = statistics.median(even), statistics.median(balanced)
    predicted = statistics.median(predicted)
    print("even split %s: median %.2f ms/step" % ("32+32+32" if args.batch == 96 else "even", e))
    print("balanced split %s: median %.2f ms/step" % (split_text, b))
    print("speedup of the balanced split: %.2fx" % (e / b))
    print("balancer's predicted step time %.2f ms vs measured %.2f ms (%+.0f%%)"
          % (predicted, b, 100.0 * (b - predicted) / predicted))


if __name__ == "__main__":
    main()
