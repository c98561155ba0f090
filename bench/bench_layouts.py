#!/usr/bin/python3
"""Activation layouts (device.layout): vtrain's training throughput with its
activations in each layout, per model and precision, on the CPU or a GPU.

    /usr/bin/python3 bench/bench_layouts.py [--backend cpu] [--models lenet:64,resnet18:32]
        [--precisions fp32,bf16] [--layouts auto,nchw,nhwc] [--runs 3] [--steps 60]

Each run is a fresh `vtrain` process on synthetic data (bench_gpu_train.py's
setup: same model presets, shapes and SGD recipe). The layouts run in
alternating rounds (A B C A B C ...) so that drifting machine load hits each
alike; the table gives each layout's median images/s, its ratio to the
first layout listed (auto: the backend's own rule, blocked nChw16c / nChw8c
on the CPU, NHWC for bf16 / fp16 on a GPU) and the peak device memory.
"""
import argparse
import os
import statistics
import sys

import bench_gpu_train as gpu_bench

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAYOUTS = ("auto", "nchw", "nhwc")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--models", default="lenet:64,resnet18:32",
                   help="comma-separated model:batch pairs (models: "
                        + ", ".join(gpu_bench.SHAPES) + ")")
    p.add_argument("--precisions", default="fp32", help="comma-separated train.precision values")
    p.add_argument("--layouts", default="auto,nchw,nhwc",
                   help="comma-separated device.layout values; ratios are to the first")
    p.add_argument("--runs", type=int, default=3, help="alternating rounds")
    p.add_argument("--steps", type=int, default=60, help="training steps per run")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: vtrain's default)")
    p.add_argument("--conv-algorithm", default="auto")
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "synthetic-lenet.yaml"))
    p.add_argument("--vtrain-set", action="append", default=[],
                   help="extra --set for vtrain (repeatable)")
    a = p.parse_args()
    if a.steps < 2:
        raise SystemExit("--steps must be at least 2")
    a.vtrain = os.path.abspath(a.vtrain)
    layouts = [x.strip() for x in a.layouts.split(",") if x.strip()]
    for x in layouts:
        if x not in LAYOUTS:
            raise SystemExit(f"--layouts: unknown '{x}' (known: {', '.join(LAYOUTS)})")
    precisions = [x.strip() for x in a.precisions.split(",") if x.strip()]
    models = gpu_bench.parse_models(a.models)
    base_sets = list(a.vtrain_set)
    print(f"vtrain {a.vtrain} on {a.backend}: {a.runs} alternating rounds of {a.steps} steps "
          f"per layout ({', '.join(layouts)}); medians; ratio to {layouts[0]}")
    print(f"{'model':10} {'batch':>5} {'prec':5} {'layout':6} {'img/s':>9} {'ratio':>6} "
          f"{'peak MiB':>9}  runs")
    for model, batch in models:
        for prec in precisions:
            ips = {x: [] for x in layouts}
            peak = {x: [] for x in layouts}
            for _ in range(a.runs):
                for layout in layouts:
                    a.vtrain_set = base_sets + [f"device.layout={layout}"]
                    end = gpu_bench.run_vtrain(a, model, batch, prec)
                    ips[layout].append(end["images_per_second"])
                    peak[layout].append(end["peak_device_bytes"])
            first = statistics.median(ips[layouts[0]])
            for layout in layouts:
                m = statistics.median(ips[layout])
                print(f"{model:10} {batch:5} {prec:5} {layout:6} {m:9.0f} {m / first:6.2f} "
                      f"{max(peak[layout]) / 2**20:9.1f}  {[round(x) for x in ips[layout]]}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
