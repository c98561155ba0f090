#!/usr/bin/env python3
"""Training throughput on one GPU: vtrain (CUDA backend, cuDNN) vs PyTorch,
same model, batch, input shape and SGD recipe, on synthetic data.

    python3 bench/bench_gpu_train.py [--models lenet:64,resnet18:128] [--runs 5]
        [--steps 300] [--vtrain build/vtrain] [--conv-algorithm auto] [--json FILE]
        [--precisions fp32,tf32,bf16,fp16] [--torch-channels-last auto|on|off]
        [--vtrain-set KEY=VALUE ...] [--vtrain-baseline-set KEY=VALUE ...]

Each run is a fresh process: `vtrain train configs/synthetic-lenet.yaml` with
the model, shape and batch set by --set, then this script in --torch-worker
mode; the two alternate (A B A B ...) so drifting load hits both alike. The
table shows per-model medians and the ratio vtrain / torch.

Timing. vtrain: `images_per_second` of the metrics file's "end" record, which
sums the per-step wall times of every training step but the first; a step
takes a batch of the host-side synthetic samples (generated once, before
training), gathered and normalized on a thread and copied to the device
during the step before (data.prefetch auto, on a GPU; the runs print how
many were), runs forward and backward, reads the loss back and applies the
SGD update. PyTorch: a fixed random batch already on the device, --warmup
untimed steps (default 10), then the remaining steps timed between two
torch.cuda.synchronize() calls. cudnn.benchmark is on.

Precisions (--precisions, each model is run in each): vtrain's
train.precision against PyTorch's counterpart:
  fp32  vtrain fp32              torch fp32, TF32 off
  tf32  vtrain tf32              torch fp32 with TF32 on (matmuls and cuDNN)
  bf16  vtrain bf16              torch AMP: autocast(bfloat16)
  fp16  vtrain fp16 (loss scaling) torch AMP: autocast(float16) + GradScaler
PyTorch runs its model and input channels_last for bf16 and fp16 on a GPU
(--torch-channels-last auto), as its AMP recipe recommends.

--vtrain-baseline-set KEY=VALUE (repeatable) adds a third side: vtrain with
these settings as well, run between the two (A A' B A A' B ...), its median
and the ratio vtrain / baseline printed beside; e.g.
--vtrain-baseline-set data.prefetch=off measures what the input prefetch
gains.

Both sides are checked to build the same net: the PyTorch model's parameter
count is printed beside the one `vtrain check` reports for the same preset.

--device cpu --backend cpu runs the same comparison on the CPU (vtrain's
oneDNN backend vs PyTorch's CPU path): for smoke-testing this script."""
import argparse
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time

from vtrain_metrics import end_record, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Per-sample input shape [C, H, W] of each model; both sides use 10 classes.
SHAPES = {"lenet": (1, 28, 28), "resnet18": (3, 32, 32), "resnet50": (3, 224, 224),
          "vgg16": (3, 224, 224)}
BATCHES = {"lenet": 64, "resnet18": 128, "resnet50": 64, "vgg16": 64}
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
CLASSES = 10
LR = 0.01
MOMENTUM = 0.9
# The synthetic training set vtrain generates (and cycles through by epochs).
TRAIN_SIZE = 2048


def parse_models(text):
    pairs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, batch = item.partition(":")
        if name not in SHAPES:
            raise SystemExit(f"unknown model '{name}' (known: {', '.join(SHAPES)})")
        pairs.append((name, int(batch) if batch else BATCHES[name]))
    return pairs


# ---- PyTorch side (runs in a fresh process: --torch-worker) -----------------

def torch_worker(a):
    import torch
    import torch.nn as nn
    sys.path.insert(0, HERE)
    import torch_train

    c, h, w = SHAPES[a.model]
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    device = torch.device(a.device)
    torch.backends.cudnn.benchmark = True
    tf32 = a.precision == "tf32"
    try:  # PyTorch >= 2.9's API (the allow_tf32 flags are deprecated there)
        torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
        torch.backends.cudnn.conv.fp32_precision = "tf32" if tf32 else "ieee"
    except (AttributeError, AssertionError):  # older: no fp32_precision
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    if a.precision == "fp16" and device.type != "cuda":
        raise SystemExit("torch fp16 AMP runs on a GPU only (autocast on the CPU is bf16)")
    scaler = None
    if a.precision == "fp16":
        try:
            scaler = torch.amp.GradScaler("cuda")
        except (AttributeError, TypeError):  # older PyTorch
            scaler = torch.cuda.amp.GradScaler()
    channels_last = a.torch_channels_last == "on" or (
        a.torch_channels_last == "auto" and amp_dtype is not None and device.type == "cuda")
    memory_format = torch.channels_last if channels_last else torch.contiguous_format

    if a.model == "lenet":
        model = torch_train.lenet(CLASSES)
    elif a.model == "resnet18":
        model = torch_train.resnet18(CLASSES, in_channels=c, small_input=min(h, w) < 64)
    elif a.model == "resnet50":
        model = torch_train.resnet50(CLASSES, in_channels=c, small_input=min(h, w) < 64)
    else:
        model = torch_train.vgg16(CLASSES, in_channels=c, side=h)
    model = model.to(device, memory_format=memory_format).train()
    parameters = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    loss_fn = nn.CrossEntropyLoss()

    x_host = torch.randn(a.batch, c, h, w).contiguous(memory_format=memory_format)
    y_host = torch.randint(0, CLASSES, (a.batch,))
    if a.torch_data == "host" and device.type == "cuda":
        x_host, y_host = x_host.pin_memory(), y_host.pin_memory()
    x, y = x_host.to(device), y_host.to(device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step():
        if a.torch_data == "host":
            xb = x_host.to(device, non_blocking=True)
            yb = y_host.to(device, non_blocking=True)
        else:
            xb, yb = x, y
        opt.zero_grad(set_to_none=True)
        with (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None
              else contextlib.nullcontext()):
            loss = loss_fn(model(xb), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if a.sync_each_step:
            loss.item()  # a host read-back per step, as vtrain does
        return loss

    warmup = max(0, min(a.warmup, a.steps - 1))
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(a.steps - warmup):
        loss = step()
    sync()
    seconds = time.perf_counter() - start
    print(json.dumps({
        "images_per_second": (a.steps - warmup) * a.batch / seconds,
        "parameters": parameters,
        "final_loss": float(loss.item()),
        "timed_steps": a.steps - warmup,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "channels_last": channels_last,
    }))


def run_torch(a, model, batch, precision):
    cmd = [a.python, os.path.abspath(__file__), "--torch-worker", "--precision", precision,
           "--torch-channels-last", a.torch_channels_last,
           "--model", model, "--batch", str(batch), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--device", a.device, "--threads", str(a.threads),
           "--torch-data", a.torch_data] + (["--sync-each-step"] if a.sync_each_step else [])
    return json.loads(run(cmd).strip().splitlines()[-1])


# ---- vtrain side -------------------------------------------------------------

def vtrain_sets(a, model, batch, precision="fp32", extra=()):
    c, h, w = SHAPES[model]
    train_size = max(TRAIN_SIZE, batch)
    epochs = math.ceil(a.steps / (train_size // batch))
    sets = [
        f"model.preset={model}",
        f"device.backend={a.backend}",
        f"data.shape=[{c},{h},{w}]",
        f"data.classes={CLASSES}",
        f"data.train_size={train_size}",
        f"train.batch={batch}",
        f"train.epochs={epochs}",
        f"train.max_steps={a.steps}",
        "train.evaluate=false",
        f"optimizer.lr={LR}",
        f"optimizer.momentum={MOMENTUM}",
        f"conv.algorithm={a.conv_algorithm}",
        f"train.precision={precision}",
    ]
    if a.threads > 0:
        sets.append(f"device.threads={a.threads}")
    sets += a.vtrain_set
    sets += list(extra)
    return [x for s in sets for x in ("--set", s)]


def vtrain_check(a, model, batch):
    cmd = [a.vtrain, "check", a.config] + vtrain_sets(a, model, batch)
    m = re.search(r"^model: (\d+) layers, (\d+) parameters", run(cmd), re.M)
    if not m:
        raise SystemExit("no 'model: N layers, P parameters' line in vtrain check's output")
    return int(m.group(1)), int(m.group(2))


def run_vtrain(a, model, batch, precision, extra=()):
    fd, metrics = tempfile.mkstemp(prefix="vtrain-bench-", suffix=".jsonl")
    os.close(fd)
    try:
        cmd = [a.vtrain, a.config, "--progress", "off", "--metrics", metrics] + \
            vtrain_sets(a, model, batch, precision, extra)
        run(cmd)
        end = end_record(metrics)
        if end.get("steps") != a.steps:
            raise SystemExit(f"vtrain ran {end.get('steps')} steps, not {a.steps}")
        return end
    finally:
        os.unlink(metrics)


# ---- driver ------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="lenet:64,resnet18:128",
                   help="comma-separated model:batch pairs (models: " + ", ".join(SHAPES) + ")")
    p.add_argument("--precisions", default="fp32",
                   help="comma-separated precisions to run each model in: " + ", ".join(PRECISIONS))
    p.add_argument("--torch-channels-last", default="auto", choices=["auto", "on", "off"],
                   help="PyTorch's model and input in channels_last (auto: for bf16 and fp16 "
                        "on a GPU)")
    p.add_argument("--runs", type=int, default=5, help="runs of each side per model")
    p.add_argument("--steps", type=int, default=300, help="training steps per run")
    p.add_argument("--warmup", type=int, default=10,
                   help="PyTorch's untimed first steps (vtrain leaves out its first step)")
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"),
                   help="the vtrain binary (default: build/vtrain in the repo)")
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "synthetic-lenet.yaml"))
    p.add_argument("--backend", default="cuda", choices=["cuda", "cpu"], help="vtrain's backend")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="PyTorch's device")
    p.add_argument("--conv-algorithm", default="auto",
                   choices=["auto", "direct", "winograd", "im2col_gemm"],
                   help="vtrain's conv.algorithm")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for both sides (0: each side's default)")
    p.add_argument("--torch-data", default="device", choices=["device", "host"],
                   help="device: one batch resident on the device (default); host: copy a "
                        "pinned host batch to the device every step, closer to vtrain")
    p.add_argument("--sync-each-step", action="store_true",
                   help="PyTorch reads the loss back every step, as vtrain does")
    p.add_argument("--vtrain-set", action="append", default=[],
                   help="extra --set for vtrain (repeatable), e.g. memory.policy=none")
    p.add_argument("--vtrain-baseline-set", action="append", default=[],
                   help="KEY=VALUE: also run vtrain with this set (a baseline), alternating")
    p.add_argument("--python", default=sys.executable, help="python for the PyTorch worker")
    p.add_argument("--json", help="write the medians (and every run) to this file")
    # Worker mode (internal): one PyTorch run, one JSON line on stdout.
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    if a.steps < 2:
        raise SystemExit("--steps must be at least 2")
    a.vtrain = os.path.abspath(a.vtrain)
    models = parse_models(a.models)
    precisions = [x.strip() for x in a.precisions.split(",") if x.strip()]
    for x in precisions:
        if x not in PRECISIONS:
            raise SystemExit(f"--precisions: unknown '{x}' (known: {', '.join(PRECISIONS)})")
    if a.threads > 0:
        os.environ["OMP_NUM_THREADS"] = str(a.threads)

    print(f"vtrain {a.vtrain} (backend {a.backend}, conv.algorithm {a.conv_algorithm}) vs "
          f"PyTorch on {a.device}; {a.runs} alternating runs of {a.steps} steps per model and "
          f"precision ({', '.join(precisions)}), SGD lr {LR} momentum {MOMENTUM}, "
          f"cudnn.benchmark on")
    print("  vtrain: synthetic data on the host, gathered, normalized and uploaded every step "
          "(in the timing; data.prefetch as set); first step excluded")
    if a.vtrain_baseline_set:
        print(f"  baseline: vtrain with {', '.join(a.vtrain_baseline_set)}, run between the two")
    data = ("a fixed random batch resident on the device" if a.torch_data == "device"
            else "a pinned host batch copied to the device every step")
    print(f"  torch:  {data}; first {min(a.warmup, a.steps - 1)} steps excluded"
          + ("; loss read back every step" if a.sync_each_step else ""))
    results = []
    for model, batch in models:
        layers, v_params = vtrain_check(a, model, batch)
        c, h, w = SHAPES[model]
        for precision in precisions:
            print(f"\n{model} batch {batch}, input {c}x{h}x{w}, {CLASSES} classes, {precision}",
                  flush=True)
            v, t, base = [], [], []
            t_params = None
            for i in range(a.runs):
                end = run_vtrain(a, model, batch, precision)
                v.append(end["images_per_second"])
                if a.vtrain_baseline_set:
                    bend = run_vtrain(a, model, batch, precision, a.vtrain_baseline_set)
                    base.append(bend["images_per_second"])
                tr = run_torch(a, model, batch, precision)
                t.append(tr["images_per_second"])
                t_params = tr["parameters"]
                if i == 0:
                    print(f"  torch {tr['torch']} on {tr['device']}"
                          + (", channels_last" if tr.get("channels_last") else ""))
                print(f"  run {i + 1}: vtrain {v[-1]:10.1f} img/s (final loss "
                      f"{end['final_loss']:.4f}, {end.get('prefetched_batches', 0)} batches "
                      f"prefetched)   torch {t[-1]:10.1f} img/s (final loss "
                      f"{tr['final_loss']:.4f})", flush=True)
                if a.vtrain_baseline_set:
                    print(f"         baseline {base[-1]:10.1f} img/s (final loss "
                          f"{bend['final_loss']:.4f}, {bend.get('prefetched_batches', 0)} "
                          f"batches prefetched)", flush=True)
            match = "match" if t_params == v_params else "MISMATCH"
            print(f"  parameters: vtrain {v_params} ({layers} layers), torch {t_params}: {match}")
            mv, mt = statistics.median(v), statistics.median(t)
            result = {"model": model, "batch": batch, "shape": [c, h, w],
                      "precision": precision,
                      "vtrain_images_per_second": mv, "torch_images_per_second": mt,
                      "ratio": mv / mt, "vtrain_runs": v, "torch_runs": t,
                      "vtrain_parameters": v_params, "torch_parameters": t_params,
                      "parameters_match": t_params == v_params}
            if base:
                mb = statistics.median(base)
                result.update({"baseline_images_per_second": mb, "baseline_runs": base,
                               "vtrain_over_baseline": mv / mb})
                print(f"  vtrain / baseline: {mv / mb:.3f} (medians {mv:.1f} / {mb:.1f}; per "
                      f"run {', '.join(f'{x / y:.3f}' for x, y in zip(v, base))})")
            results.append(result)

    print(f"\n{'model':10} {'batch':>6} {'precision':>9} {'vtrain img/s':>13} {'torch img/s':>12} "
          f"{'vtrain/torch':>13} {'params':>9}")
    for r in results:
        print(f"{r['model']:10} {r['batch']:6d} {r['precision']:>9} "
              f"{r['vtrain_images_per_second']:13.1f} "
              f"{r['torch_images_per_second']:12.1f} {r['ratio']:13.3f} "
              f"{'match' if r['parameters_match'] else 'MISMATCH':>9}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "device": a.device,
                       "conv_algorithm": a.conv_algorithm, "steps": a.steps, "runs": a.runs,
                       "warmup": a.warmup, "torch_data": a.torch_data,
                       "sync_each_step": a.sync_each_step,
                       "baseline_sets": a.vtrain_baseline_set, "results": results}, f, indent=2)
            f.write("\n")
    return 0 if all(r["parameters_match"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
