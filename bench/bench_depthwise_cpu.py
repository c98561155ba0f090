#!/usr/bin/python3
"""Depthwise convolutions on the CPU: vtrain's against PyTorch's, forward
plus backward (data and filter), on MobileNetV2's depthwise 3x3 shapes at a
32x32 input (issue 43: depthwise convolutions are where frameworks are
slowest).

    /usr/bin/python3 bench/bench_depthwise_cpu.py [--runs 5] [--batch 32] [--threads 2]
                                                  [--layout auto] [--algorithm auto]
                                                  [--torch-channels-last] [--vtrain PATH]

vtrain: one `vtrain profile` of a chain of the depthwise layers (groups =
channels, no bias; a 1x1 conv between stages changes the channels), whose
layer costs (the perf DB's layer_measurements: each layer's forward and
backward, median of profile.repeats, timed in place) give each depthwise
layer's time; --layout and --algorithm are device.layout and
conv.algorithm (auto: the fastest per kernel, as training picks). PyTorch:
each depthwise nn.Conv2d alone, x with requires_grad (so that backward
computes dx, as in the chain), median of as many timed calls after a
warm-up, in NCHW or with --torch-channels-last. torch.set_num_threads
equals vtrain's device.threads. Runs alternate (vtrain, PyTorch, vtrain,
...) so drifting machine load hits both alike. Prints per-layer medians
and, per run, the ratio PyTorch time / vtrain time over all the layers
(above 1: vtrain is faster) with its median. Needs build/vtrain and
Debian's python3-torch."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# MobileNetV2's depthwise 3x3 convolutions at a 32x32 input (stem at stride
# 1, vtrain's and the benchmark's small-input rule): (channels, input side,
# stride), in network order, repeats of a shape left out.
SHAPES = [(32, 32, 1), (96, 32, 2), (144, 16, 1), (144, 16, 2), (192, 8, 1), (192, 8, 2),
          (384, 4, 1), (576, 4, 1), (576, 4, 2), (960, 2, 1)]
REPEATS = 5


def chain_config(batch, threads, layout, algorithm):
    """The YAML of the chain: dw<i> is SHAPES[i]; pw<i> a 1x1 to the next
    shape's channels where they differ."""
    first = SHAPES[0]
    layers = ["    - {name: data, type: input}", "    - {name: r, type: relu}"]
    for i, (c, _, stride) in enumerate(SHAPES):
        layers.append(f"    - {{name: dw{i}, type: conv, out: {c}, kernel: 3, pad: 1, "
                      f"stride: {stride}, groups: {c}, bias: false}}")
        if i + 1 < len(SHAPES) and SHAPES[i + 1][0] != c:
            layers.append(f"    - {{name: pw{i}, type: conv, out: {SHAPES[i + 1][0]}, kernel: 1}}")
    layers += ["    - {name: gap, type: pool, mode: avg, global: true}",
               "    - {name: fc, type: fc, out: 10}"]
    return ("model:\n  layers:\n" + "\n".join(layers) + "\n"
            f"data: {{kind: synthetic, shape: [{first[0]}, {first[1]}, {first[1]}], classes: 10, "
            f"train_size: {batch}, test_size: {batch}}}\n"
            f"train: {{batch: {batch}, evaluate: false}}\n"
            f"device: {{threads: {threads}, layout: {layout}}}\n"
            f"conv: {{algorithm: {algorithm}}}\n"
            f"profile: {{steps: false, repeats: {REPEATS}}}\n")


def run_vtrain(binary, batch, threads, layout, algorithm):
    """{layer index: forward + backward ms} of one profile."""
    with tempfile.TemporaryDirectory() as d:
        config = os.path.join(d, "dw.yaml")
        with open(config, "w") as f:
            f.write(chain_config(batch, threads, layout, algorithm))
        db = os.path.join(d, "perf.db")
        subprocess.run([binary, "profile", config, "--db", db], check=True,
                       stdout=subprocess.DEVNULL)
        out = subprocess.run([binary, "db", "export", "--db", db, "--table",
                              "layer_measurements", "--format", "jsonl"],
                             check=True, capture_output=True, text=True).stdout
    times = {}
    for line in out.splitlines():
        row = json.loads(line)
        name = row["layer_name"]
        if name.startswith("dw"):
            times[int(name[2:])] = row["forward_ms"] + row["backward_ms"]
    if len(times) != len(SHAPES):
        raise SystemExit(f"bench_depthwise_cpu: the profile holds {len(times)} depthwise "
                         f"layers, expected {len(SHAPES)}")
    return times


def run_torch(batch, threads, channels_last):
    """{layer index: forward + backward ms}, each layer alone."""
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    times = {}
    for i, (c, side, stride) in enumerate(SHAPES):
        conv = torch.nn.Conv2d(c, c, 3, stride=stride, padding=1, groups=c, bias=False)
        x = torch.randn(batch, c, side, side)
        if channels_last:
            conv = conv.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        x.requires_grad_(True)
        dy = torch.randn_like(conv(x))

        def call():
            conv.zero_grad(set_to_none=True)
            x.grad = None
            conv(x).backward(dy)
        call()  # warm-up
        runs = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            call()
            runs.append((time.perf_counter() - start) * 1e3)
        times[i] = statistics.median(runs)
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layout", default="auto", choices=["auto", "nchw", "nhwc"])
    p.add_argument("--algorithm", default="auto")
    p.add_argument("--torch-channels-last", action="store_true")
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    print(f"# batch {a.batch}, {a.threads} threads, vtrain layout {a.layout}, algorithm "
          f"{a.algorithm}; torch {'channels_last' if a.torch_channels_last else 'NCHW'}; "
          f"{a.runs} runs each, alternating; fwd + bwd ms per depthwise layer")
    v, t = [], []
    for _ in range(a.runs):
        v.append(run_vtrain(a.vtrain, a.batch, a.threads, a.layout, a.algorithm))
        t.append(run_torch(a.batch, a.threads, a.torch_channels_last))
    print(f"{'layer':28} {'vtrain ms':>10} {'torch ms':>9} {'torch/vtrain':>12}")
    for i, (c, side, stride) in enumerate(SHAPES):
        mv = statistics.median(r[i] for r in v)
        mt = statistics.median(r[i] for r in t)
        name = f"dw{i} c{c} {side}x{side} s{stride}"
        print(f"{name:28} {mv:10.3f} {mt:9.3f} {mt / mv:12.2f}")
    ratios = [sum(rt.values()) / sum(rv.values()) for rv, rt in zip(v, t)]
    print(f"all layers: vtrain {statistics.median(sum(r.values()) for r in v):.3f} ms, "
          f"torch {statistics.median(sum(r.values()) for r in t):.3f} ms; "
          f"per-run ratios torch/vtrain {[round(r, 2) for r in ratios]}, "
          f"median {statistics.median(ratios):.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
