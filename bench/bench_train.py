#!/usr/bin/python3
"""Training throughput: vtrain vs PyTorch on the same machine, model, batch,
data and threads (the foundation issue's benchmark).

    /usr/bin/python3 bench/bench_train.py [--runs 5] [--steps 200] [--threads 2] [--vtrain PATH]

Alternates vtrain and PyTorch runs (A B A B ...) so drifting machine load hits
both alike, and prints per-model medians, the ratio of medians, and vtrain's
GFLOP/s (training FLOPs = 3 x forward multiply-adds x 2, the usual
convention; the first conv's skipped backward-data is not subtracted).
Needs build/vtrain and Debian's python3-torch (with libopenblas0)."""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from vtrain_metrics import end_record

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Forward multiply-adds per sample (conv: K*C*R*S*OH*OW; fc: in*out).
FORWARD_MACS = {
    "lenet": 20 * 1 * 25 * 24 * 24 + 50 * 20 * 25 * 8 * 8 + 800 * 500 + 500 * 10,
    "vgg-small": (64 * 1 * 9 * 28 * 28 + 64 * 64 * 9 * 28 * 28 + 128 * 64 * 9 * 14 * 14
                  + 128 * 128 * 9 * 14 * 14 + 6272 * 256 + 256 * 10),
}
CONFIGS = {"lenet": "configs/fmnist-lenet.yaml", "vgg-small": "configs/fmnist-vgg-small.yaml"}
LR = {"lenet": 0.05, "vgg-small": 0.02}


def run_vtrain(binary, model, steps, threads, extra):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
        cmd = [binary, os.path.join(ROOT, CONFIGS[model]),
               "--progress", "off", "--metrics", m.name,
               "--set", f"train.max_steps={steps}", "--set", "train.evaluate=false",
               "--set", f"device.threads={threads}"] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return end_record(m.name)["images_per_second"]


def run_torch(model, steps, threads):
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_train.py"),
                          "--model", model, "--steps", str(steps), "--threads", str(threads),
                          "--lr", str(LR[model])], check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default="lenet,vgg-small")
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"),
                   help="the vtrain binary (default: build/vtrain in the repo)")
    p.add_argument("--vtrain-set", action="append", default=[],
                   help="extra --set for vtrain, e.g. conv.algorithm=winograd")
    a = p.parse_args()
    env_threads = str(a.threads)
    os.environ["OMP_NUM_THREADS"] = env_threads
    extra = [x for s in a.vtrain_set for x in ("--set", s)]
    print(f"{'model':10} {'vtrain img/s':>13} {'torch img/s':>12} {'ratio':>6} {'vtrain GFLOP/s':>15}")
    for model in a.models.split(","):
        v, t = [], []
        for _ in range(a.runs):
            v.append(run_vtrain(a.vtrain, model, a.steps, a.threads, extra))
            t.append(run_torch(model, a.steps, a.threads))
        mv, mt = statistics.median(v), statistics.median(t)
        gflops = mv * 3 * 2 * FORWARD_MACS[model] / 1e9
        print(f"{model:10} {mv:13.0f} {mt:12.0f} {mv / mt:6.2f} {gflops:15.1f}")
        print(f"  runs vtrain {[round(x) for x in v]}  torch {[round(x) for x in t]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
