#!/usr/bin/python3
"""Gradient allreduce in fp32 vs half (train.gradient_allreduce) on 2 ranks
in bf16 (the mixed-precision issue's measurement of "gradients reduced in
fp32 or in half with an fp32 accumulation").

    /usr/bin/python3 bench/bench_half_allreduce.py [--runs 3] [--ranks 2] [--vtrain PATH]
        [--steps lenet=200,vgg-small=40] [--accuracy-steps 937]

For LeNet and vgg-small on Fashion-MNIST, batch 64, 1 thread per rank:
alternating fp32 / half runs, medians of images/s and of the allreduce's
milliseconds per step (the time the communication thread spent in
MPI_Allreduce, and the part of it the step waited for). Then one LeNet run
each way of --accuracy-steps steps with the test accuracy it ends with.
Needs build/vtrain, Open MPI and a CPU with native bf16 (AVX-512 BF16 or
AMX)."""
import argparse
import os
import statistics
import tempfile

from vtrain_metrics import end_record, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = {"lenet": "configs/fmnist-lenet.yaml", "vgg-small": "configs/fmnist-vgg-small.yaml"}


def train(binary, ranks, model, steps, allreduce, evaluate):
    """The end record of one bf16 run on `ranks` ranks."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
        cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "--oversubscribe", "-np", str(ranks),
               "--bind-to", "none", binary, os.path.join(ROOT, CONFIGS[model]),
               "--progress", "off", "--metrics", m.name,
               "--set", f"train.max_steps={steps}", "--set", "train.batch=64",
               "--set", "device.threads=1", "--set", "train.precision=bf16",
               "--set", f"train.gradient_allreduce={allreduce}",
               "--set", f"train.evaluate={'true' if evaluate else 'false'}"]
        run(cmd)
        return end_record(m.name)


def speed(a, model, steps):
    runs = {"fp32": [], "half": []}
    for _ in range(a.runs):
        for allreduce in ("fp32", "half"):
            runs[allreduce].append(train(a.vtrain, a.ranks, model, steps, allreduce, False))
    for allreduce, records in runs.items():
        ips = statistics.median(r["images_per_second"] for r in records)
        ar = statistics.median(1000 * r["allreduce_seconds"] / r["steps"] for r in records)
        waited = statistics.median(1000 * r["allreduce_exposed_seconds"] / r["steps"]
                                   for r in records)
        print(f"| {model} | {allreduce} | {ips:.0f} | {ar:.2f} | {waited:.2f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    p.add_argument("--steps", default="lenet=200,vgg-small=40",
                   help="timed steps per model, model=steps,...")
    p.add_argument("--accuracy-steps", type=int, default=937, help="937: one epoch")
    a = p.parse_args()
    steps = {k: int(v) for k, v in (item.split("=") for item in a.steps.split(","))}
    print(f"bf16, {a.ranks} ranks x 1 thread, batch 64, Fashion-MNIST; medians of {a.runs} "
          "alternating runs")
    print("| model | allreduce | img/s | allreduce ms/step | waited ms/step |")
    print("| --- | --- | --- | --- | --- |")
    for model, n in steps.items():
        speed(a, model, n)
    for allreduce in ("fp32", "half"):
        r = train(a.vtrain, a.ranks, "lenet", a.accuracy_steps, allreduce, True)
        print(f"LeNet, {a.accuracy_steps} steps, {allreduce} allreduce: test accuracy "
              f"{r['test_accuracy']:.4f}, final loss {r['final_loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()
