#!/usr/bin/python3
"""Time to fill the perf DB: `vtrain profile` for LeNet and vgg-small under
each micro-batch policy (undivided, powerOfTwo, all) on a fresh DB, then the
same command again (everything cached).

    /usr/bin/python3 bench/bench_profile.py [--models lenet,vgg-small] [--batch 64]

Prints wall-clock seconds of both runs (process start to exit) and how many
kernel items each measured."""
import argparse
import os
import re
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"lenet": "configs/fmnist-lenet.yaml", "vgg-small": "configs/fmnist-vgg-small.yaml"}


def profile(config, db, policy, batch):
    start = time.perf_counter()
    out = subprocess.run([os.path.join(ROOT, "build", "vtrain"), "profile", os.path.join(ROOT, config),
                          "--db", db, "--set", f"profile.micro_batches={policy}",
                          "--set", f"profile.batches=[{batch}]"],
                         check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - start
    measured = sum(int(x) for x in re.findall(r"(\d+) kernel items measured", out))
    return seconds, measured


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="lenet,vgg-small")
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    print(f"{'model':10} {'policy':11} {'items':>6} {'first s':>8} {'second s':>9}")
    for model in a.models.split(","):
        for policy in ("undivided", "powerOfTwo", "all"):
            with tempfile.TemporaryDirectory() as d:
                db = os.path.join(d, "perf.db")
                first, items = profile(CONFIGS[model], db, policy, a.batch)
                second, again = profile(CONFIGS[model], db, policy, a.batch)
                assert again == 0, "second run measured again"
                print(f"{model:10} {policy:11} {items:6d} {first:8.1f} {second:9.2f}", flush=True)


if __name__ == "__main__":
    main()
