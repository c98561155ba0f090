#!/usr/bin/python3
"""Training throughput: vtrain vs PyTorch on the same machine, model, batch,
data and threads (the foundation issue's benchmark).

    /usr/bin/python3 bench/bench_train.py [--runs 5] [--steps 200] [--threads 2] [--vtrain PATH]
                                          [--precisions fp32,bf16] [--baseline PATH]

Alternates vtrain and PyTorch runs (A B A B ...) so drifting machine load hits
both alike, and prints per-model (and per-precision) medians, the ratio of
medians, vtrain's peak device memory and GFLOP/s. Precision bf16 is vtrain's
train.precision: bf16 against PyTorch's CPU autocast to bfloat16 (needs a CPU
with AVX-512 BF16 or AMX for vtrain; a ratio column compares each precision
with fp32 of the same program). Training FLOPs = 3 x forward multiply-adds
x 2, the usual convention; the first conv's skipped backward-data is not
subtracted. --baseline runs a second vtrain binary (an older build, say) in
the same rounds and prints this one's ratio to it.
--models takes lenet and vgg-small (Fashion-MNIST, against PyTorch) and
PRESET:CxHxW, a preset on synthetic data of that shape, vtrain alone (its
PyTorch and GFLOP/s columns print nan), e.g. alexnet:3x224x224 with
--vtrain-set train.batch=16 --baseline OLD_BUILD/vtrain.
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


def model_args(model):
    """The config and --set options that train `model`: a name of CONFIGS
    (Fashion-MNIST), or PRESET:CxHxW, the preset on synthetic data of that
    shape (vtrain only: PyTorch is not run for it)."""
    if model in CONFIGS:
        return [os.path.join(ROOT, CONFIGS[model])]
    preset, _, shape = model.partition(":")
    dims = shape.split("x")
    if len(dims) != 3 or not all(d.isdigit() for d in dims):
        raise SystemExit(f"bench_train: --models entry '{model}': expected one of "
                         f"{', '.join(CONFIGS)} or PRESET:CxHxW, e.g. alexnet:3x224x224")
    return [os.path.join(ROOT, "configs", "synthetic-lenet.yaml"),
            "--set", f"model.preset={preset}", "--set", f"data.shape=[{','.join(dims)}]"]


def run_vtrain(binary, model, steps, threads, precision, extra):
    """(images/s, peak device bytes) of one run."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
        cmd = [binary] + model_args(model) + [
               "--progress", "off", "--metrics", m.name,
               "--set", f"train.max_steps={steps}", "--set", "train.evaluate=false",
               "--set", f"device.threads={threads}",
               "--set", f"train.precision={precision}"] + extra
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        end = end_record(m.name)
        return end["images_per_second"], end["peak_device_bytes"]


def run_torch(model, steps, threads, precision):
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_train.py"),
                          "--model", model, "--steps", str(steps), "--threads", str(threads),
                          "--lr", str(LR[model]), "--precision", precision],
                         check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default="lenet,vgg-small")
    p.add_argument("--precisions", default="fp32",
                   help="comma-separated train.precision values (fp32, bf16)")
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"),
                   help="the vtrain binary (default: build/vtrain in the repo)")
    p.add_argument("--baseline", help="another vtrain binary to alternate with --vtrain")
    p.add_argument("--vtrain-set", action="append", default=[],
                   help="extra --set for vtrain, e.g. conv.algorithm=winograd")
    a = p.parse_args()
    env_threads = str(a.threads)
    os.environ["OMP_NUM_THREADS"] = env_threads
    extra = [x for s in a.vtrain_set for x in ("--set", s)]
    precisions = a.precisions.split(",")
    base_cols = f" {'baseline img/s':>15} {'vs baseline':>11}" if a.baseline else ""
    print(f"{'model':10} {'prec':5} {'vtrain img/s':>13} {'torch img/s':>12} {'ratio':>6} "
          f"{'vs fp32 (vtrain, torch)':>24} {'vtrain peak MiB':>16} {'GFLOP/s':>8}{base_cols}")
    for model in a.models.split(","):
        v = {p: [] for p in precisions}
        peak = {p: [] for p in precisions}
        t = {p: [] for p in precisions}
        base = {p: [] for p in precisions}
        for _ in range(a.runs):
            for prec in precisions:
                ips, peak_bytes = run_vtrain(a.vtrain, model, a.steps, a.threads, prec, extra)
                v[prec].append(ips)
                peak[prec].append(peak_bytes)
                if a.baseline:
                    base[prec].append(run_vtrain(a.baseline, model, a.steps, a.threads, prec,
                                                 extra)[0])
                if model in CONFIGS:
                    t[prec].append(run_torch(model, a.steps, a.threads, prec))
        for prec in precisions:
            mv = statistics.median(v[prec])
            mt = statistics.median(t[prec]) if t[prec] else float("nan")
            vs = "-"
            if prec != "fp32" and "fp32" in v:
                torch_vs = mt / statistics.median(t["fp32"]) if t[prec] else float("nan")
                vs = f"{mv / statistics.median(v['fp32']):.2f}x, {torch_vs:.2f}x"
            gflops = mv * 3 * 2 * FORWARD_MACS.get(model, float("nan")) / 1e9
            base_cells, base_runs = "", ""
            if a.baseline:
                mb = statistics.median(base[prec])
                base_cells = f" {mb:15.1f} {mv / mb:10.2f}x"
                base_runs = f"  baseline {[round(x, 1) for x in base[prec]]}"
            print(f"{model:10} {prec:5} {mv:13.1f} {mt:12.1f} {mv / mt:6.2f} {vs:>24} "
                  f"{max(peak[prec]) / 2**20:16.1f} {gflops:8.1f}{base_cells}")
            print(f"  runs vtrain {[round(x, 1) for x in v[prec]]}  torch {[round(x) for x in t[prec]]}"
                  f"{base_runs}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
