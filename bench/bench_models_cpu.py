#!/usr/bin/python3
"""Training throughput of the mobile nets on the CPU: vtrain's mobilenet_v2
and efficientnet_b0 presets against torchvision's models (issue 43's
figure: depthwise convolutions are where frameworks are slowest).

    /usr/bin/python3 bench/bench_models_cpu.py [--runs 5] [--steps 30] [--batch 32]
                                               [--shape 3x32x32] [--threads 2]
                                               [--models mobilenet_v2,efficientnet_b0]
                                               [--vtrain PATH] [--torch-only]

Both sides train the same architecture (vtrain's presets follow torchvision's
layer for layer; EfficientNet without stochastic depth on both; below 64x64
both run the stem conv at stride 1) on random data of --shape with 10
classes, SGD with momentum, the same batch and threads. Runs alternate
(vtrain, PyTorch, vtrain, ...) so drifting machine load hits both alike;
the first step of each run is not timed. Prints per-model medians and the
ratio vtrain / PyTorch. --torch-only times PyTorch alone (the ratio prints
nan). Needs build/vtrain and Debian's python3-torch and python3-torchvision."""
import argparse
import os
import statistics
import subprocess
import sys

from bench_train import HERE, ROOT, model_args, run_vtrain

MODELS = ["mobilenet_v2", "efficientnet_b0"]
LR = 0.05  # both sides; throughput does not depend on it


def run_torch(model, shape, batch, steps, threads):
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_train.py"),
                          "--model", model, "--shape", shape, "--batch", str(batch),
                          "--steps", str(steps), "--threads", str(threads), "--lr", str(LR)],
                         check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def vtrain_sets(batch, steps):
    """--set options beyond bench_train's: the batch, and synthetic data
    enough for the steps (an epoch must not end before max_steps)."""
    sets = [f"train.batch={batch}", f"data.train_size={batch * (steps + 1)}",
            "data.test_size=" + str(batch), f"optimizer.lr={LR}"]
    return [x for s in sets for x in ("--set", s)]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--shape", default="3x32x32", help="CxHxW of the random images")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    p.add_argument("--torch-only", action="store_true",
                   help="time PyTorch alone (vtrain's column prints nan)")
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    models = a.models.split(",")
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"bench_models_cpu: --models entry '{m}': expected one of "
                             f"{', '.join(MODELS)}")
    model_args(f"{models[0]}:{a.shape}")  # refuses a malformed --shape before any run
    print(f"# batch {a.batch}, {a.shape}, {a.threads} threads, {a.steps} steps per run "
          f"(first untimed), {a.runs} runs each, alternating")
    print(f"{'model':16} {'vtrain img/s':>13} {'torch img/s':>12} {'ratio':>6}")
    for model in models:
        v, t = [], []
        for _ in range(a.runs):
            if not a.torch_only:
                v.append(run_vtrain(a.vtrain, f"{model}:{a.shape}", a.steps, a.threads, "fp32",
                                    vtrain_sets(a.batch, a.steps))[0])
            t.append(run_torch(model, a.shape, a.batch, a.steps, a.threads))
        mv = statistics.median(v) if v else float("nan")
        mt = statistics.median(t)
        print(f"{model:16} {mv:13.1f} {mt:12.1f} {mv / mt:6.2f}")
        print(f"  runs vtrain {[round(x, 1) for x in v]}  torch {[round(x, 1) for x in t]}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
