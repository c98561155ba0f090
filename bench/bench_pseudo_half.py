#!/usr/bin/env python3
"""mu-cuDNN's precision substitution on this GPU (its Fig. 8): per fp16
convolution kernel, how much faster the fastest algorithm is when
PSEUDO_HALF (f16 tensors, f32 compute: "<name>/pseudo_half") may be chosen
beside TRUE_HALF (f16 compute: "<name>/true_half"), and how often it is the
one chosen.

    python3 bench/bench_pseudo_half.py [--vtrain build/vtrain]
        [--models resnet50:64,vgg16:64] [--db pseudo_half.db] [--repeats 5]

For each model, `vtrain profile` with train.precision fp16 times every
algorithm cuDNN offers for each convolution kernel (Forward, BackwardData,
BackwardFilter) at the batch, undivided, into a perf DB of that model's own
(--db pseudo_half.db gives pseudo_half-resnet50.db, ...: in one DB a model
would also list the kernels of the models profiled before it); the script
then reads the DB back (`vtrain db export`). The summary counts each
distinct kernel once. Needs the CUDA backend and a GPU
with fp16 (compute capability 7.0 or newer)."""
import argparse
import csv
import io
import math
import os
import statistics
import sys

from vtrain_metrics import run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"lenet": (1, 28, 28), "resnet18": (3, 32, 32), "resnet50": (3, 224, 224),
          "vgg16": (3, 224, 224), "alexnet": (3, 224, 224), "googlenet": (3, 224, 224)}
TRUE, PSEUDO = "/true_half", "/pseudo_half"


def export(vtrain, db, table):
    return list(csv.DictReader(io.StringIO(
        run([vtrain, "db", "export", "--db", db, "--table", table, "--format", "csv"]))))


def speedups(kernels, measurements, batch):
    """Per f16 kernel at micro-batch `batch`: (kind, shape, fastest TRUE_HALF
    ms or None, fastest over both ms, whether PSEUDO_HALF is the fastest)."""
    by_id = {k["id"]: k for k in kernels if k["dtype"] == "f16"}
    best = {}  # kernel id -> {"true": ms, "all": ms, "pseudo_wins": bool}
    for m in measurements:
        k = by_id.get(m["kernel_id"])
        if k is None or int(m["micro_batch"]) != batch:
            continue
        name, ms = m["algorithm"], float(m["time_ms"])
        if not (name.endswith(TRUE) or name.endswith(PSEUDO)):
            continue
        b = best.setdefault(m["kernel_id"], {"true": None, "all": None, "pseudo_wins": False})
        if name.endswith(TRUE) and (b["true"] is None or ms < b["true"]):
            b["true"] = ms
        if b["all"] is None or ms < b["all"]:
            b["all"] = ms
            b["pseudo_wins"] = name.endswith(PSEUDO)
    rows = []
    for kid, b in best.items():
        k = by_id[kid]
        shape = "%sx%sx%sx%s k%s %sx%s s%s" % (k["n"], k["c"], k["h"], k["w"], k["k"], k["r"],
                                             k["s"], k["stride_h"])
        rows.append((k["kind"], shape, b["true"], b["all"], b["pseudo_wins"]))
    return sorted(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "synthetic-lenet.yaml"))
    ap.add_argument("--models", default="resnet50:64,vgg16:64",
                    help="comma-separated model:batch pairs (" + ", ".join(SHAPES) + ")")
    ap.add_argument("--db", default="pseudo_half.db",
                    help="the perf DBs' name: X.db profiles each model M into X-M.db")
    ap.add_argument("--repeats", type=int, default=5, help="profile.repeats")
    a = ap.parse_args()
    distinct = {}  # (kind, problem) -> (true_half ms or None, best ms, whether pseudo wins)
    stem, ext = os.path.splitext(a.db)
    for item in a.models.split(","):
        model, _, batch = item.partition(":")
        if model not in SHAPES or not batch.isdigit():
            raise SystemExit("--models: '%s' is not model:batch (models: %s)"
                             % (item, ", ".join(SHAPES)))
        batch = int(batch)
        c, h, w = SHAPES[model]
        db = "%s-%s%s" % (stem, model, ext or ".db")
        run([a.vtrain, "profile", a.config, "--db", db, "--set", "model.preset=" + model,
             "--set", "data.shape=[%d,%d,%d]" % (c, h, w), "--set", "train.batch=%d" % batch,
             "--set", "train.precision=fp16", "--set", "device.backend=cuda",
             "--set", "profile.batches=[%d]" % batch, "--set", "profile.steps=false",
             "--set", "profile.repeats=%d" % a.repeats])
        rows = speedups(export(a.vtrain, db, "kernels"),
                        export(a.vtrain, db, "kernel_measurements"), batch)
        print("\n%s batch %d: %d fp16 kernels" % (model, batch, len(rows)))
        print("  %-15s %-28s %12s %12s %8s  %s" % ("kind", "problem", "true_half ms",
                                                   "best ms", "speedup", "fastest"))
        for kind, shape, true_ms, best_ms, pseudo in rows:
            distinct[(kind, shape)] = (true_ms, best_ms, pseudo)
            if true_ms is None:
                print("  %-15s %-28s %12s %12.3f %8s  %s" % (kind, shape, "none", best_ms, "-",
                                                              "pseudo_half"))
                continue
            print("  %-15s %-28s %12.3f %12.3f %7.2fx  %s"
                  % (kind, shape, true_ms, best_ms, true_ms / best_ms,
                     "pseudo_half" if pseudo else "true_half"))
    if not distinct:
        raise SystemExit("no fp16 kernel measurements in the perf DBs of " + a.db)
    kernels_seen = len(distinct)
    wins = sum(pseudo for _, _, pseudo in distinct.values())
    without_true = sum(true_ms is None for true_ms, _, _ in distinct.values())
    all_speedups = [true_ms / best_ms for true_ms, best_ms, _ in distinct.values()
                    if true_ms is not None]
    print("\n%d distinct kernels: PSEUDO_HALF fastest in %d (%.0f%%; mu-cuDNN on a V100: 69%%)"
          % (kernels_seen, wins, 100.0 * wins / kernels_seen))
    if without_true:
        print("%d kernels have no TRUE_HALF algorithm on this GPU" % without_true)
    if all_speedups:
        geo = math.exp(statistics.mean(math.log(x) for x in all_speedups))
        print("speedup of allowing PSEUDO_HALF over TRUE_HALF only: median %.2fx, geometric "
              "mean %.2fx, max %.2fx (mu-cuDNN: up to 4.54x)"
              % (statistics.median(all_speedups), geo, max(all_speedups)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
