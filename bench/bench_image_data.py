#!/usr/bin/python3
"""The input pipeline alone: vtrain (`vtrain data bench`, from the JPEG
folder and from its shards) against torchvision's ImageFolder + DataLoader
(bench/torch_image_pipeline.py), decode + RandomResizedCrop(224) + flip +
normalise, no training, at 1 and 2 workers.

    /usr/bin/python3 bench/make_fmnist_images.py /tmp/fmimg --large 3000
    /usr/bin/python3 bench/bench_image_data.py /tmp/fmimg/large [--runs 5] [--batches 20] [--vtrain build/vtrain]

Packs the folder's training set into shards once (vtrain data pack), then
runs the programs in turn (A B C A B C ...) so that drifting load hits them
alike, and prints per worker count the medians, vtrain's ratio to
torchvision and the images/s per worker, as a Markdown table."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def rate(command):
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(re.search(r"([0-9.]+) img/s", out).group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="OUT/large of make_fmnist_images.py")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--vtrain", default=os.path.join(HERE, "..", "build", "vtrain"))
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="vtrain-image-bench-")
    transform = "{crop: random_resized, flip: true}"

    def config(kind_lines):
        path = os.path.join(work, f"{len(os.listdir(work))}.yaml")
        with open(path, "w") as f:
            f.write("model: {preset: lenet}\ndata:\n" + kind_lines + "  shape: [3, 224, 224]\n"
                    f"  mean: [0.5, 0.5, 0.5]\n  std: [0.25, 0.25, 0.25]\n  train_transform: {transform}\n")
        return path

    folder_cfg = config(f"  kind: imagefolder\n  train_dir: {a.folder}/train\n  test_dir: {a.folder}/test\n")
    subprocess.run([a.vtrain, "data", "pack", folder_cfg, "--out", os.path.join(work, "train")], check=True)
    shards = sorted(f for f in os.listdir(work) if f.endswith(".tar"))
    shard_cfg = config(f"  kind: shards\n  train_shards: [{', '.join(os.path.join(work, s) for s in shards)}]\n"
                       f"  test_shards: [{os.path.join(work, shards[0])}]\n")

    workers = [int(w) for w in a.workers.split(",")]
    programs = {
        "vtrain folder": lambda w: [a.vtrain, "data", "bench", folder_cfg, "--workers", str(w), "--batch",
                                    str(a.batch), "--batches", str(a.batches)],
        "vtrain shards": lambda w: [a.vtrain, "data", "bench", shard_cfg, "--workers", str(w), "--batch",
                                    str(a.batch), "--batches", str(a.batches)],
        "torchvision folder": lambda w: [sys.executable, os.path.join(HERE, "torch_image_pipeline.py"),
                                         f"{a.folder}/train", "--workers", str(w), "--batch", str(a.batch),
                                         "--batches", str(a.batches)],
    }
    results = {(name, w): [] for name in programs for w in workers}
    for run in range(a.runs):
        for w in workers:
            for name, command in programs.items():
                results[(name, w)].append(rate(command(w)))
        print(f"run {run + 1}/{a.runs} done", file=sys.stderr)

    print("| workers | program | images/s (median of %d) | per worker | vs torchvision | runs |" % a.runs)
    print("| --- | --- | --- | --- | --- | --- |")
    for w in workers:
        base = statistics.median(results[("torchvision folder", w)])
        for name in programs:
            m = statistics.median(results[(name, w)])
            runs = ", ".join(f"{r:.0f}" for r in results[(name, w)])
            print(f"| {w} | {name} | {m:.0f} | {m / w:.0f} | {m / base:.2f}x | {runs} |")


if __name__ == "__main__":
    main()
