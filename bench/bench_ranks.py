#!/usr/bin/python3
"""Data-parallel scaling on one machine: vtrain with 1 rank x T threads vs
N ranks x T/N threads on the same cores (the distributed issue's benchmark).

    /usr/bin/python3 bench/bench_ranks.py [--runs 3] [--steps 300] [--ranks 2] [--config ...]

Alternates the two set-ups, prints median img/s, step time, the ratio, and
for N ranks the allreduce time and the fraction of it hidden behind backward
(1 - time the step waited / time the allreduces took)."""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(ranks, threads, config, steps, batch):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as m:
        cmd = [os.path.join(ROOT, "build", "vtrain"), os.path.join(ROOT, config),
               "--progress", "off", "--metrics", m.name, "--set", f"train.max_steps={steps}",
               "--set", "train.evaluate=false", "--set", f"device.threads={threads}",
               "--set", f"train.batch={batch}"]
        if ranks > 1:
            cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "--oversubscribe", "-np",
                   str(ranks), "--bind-to", "none"] + cmd
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return [json.loads(line) for line in open(m.name)][-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="threads of the 1-rank run")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--config", default="configs/fmnist-lenet.yaml")
    a = p.parse_args()
    one, many = [], []
    for _ in range(a.runs):
        one.append(run(1, a.threads, a.config, a.steps, a.batch))
        many.append(run(a.ranks, max(1, a.threads // a.ranks), a.config, a.steps, a.batch))
    i1 = statistics.median(r["images_per_second"] for r in one)
    iN = statistics.median(r["images_per_second"] for r in many)
    ar = statistics.median(r["allreduce_seconds"] for r in many)
    exposed = statistics.median(r["allreduce_exposed_seconds"] for r in many)
    hidden = statistics.median(1 - r["allreduce_exposed_seconds"] / r["allreduce_seconds"]
                               for r in many if r["allreduce_seconds"] > 0)
    print(f"{a.config}, batch {a.batch}, {a.steps} steps, median of {a.runs} alternating runs")
    print(f"  1 rank  x {a.threads} threads: {i1:8.0f} img/s  {1000 * a.batch / i1:7.2f} ms/step")
    print(f"  {a.ranks} ranks x {max(1, a.threads // a.ranks)} threads: {iN:8.0f} img/s  "
          f"{1000 * a.batch / iN:7.2f} ms/step  ({iN / i1:.2f}x)")
    print(f"  allreduce {ar:.2f} s per run, step waited {exposed:.2f} s: {100 * hidden:.0f}% hidden "
          f"behind backward")


if __name__ == "__main__":
    main()
