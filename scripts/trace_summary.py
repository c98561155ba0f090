#!/usr/bin/python3
"""Where a training step's compute time goes, from a Chrome trace of
`vtrain train --trace FILE`: per rank, the median per step of each layer
type's forward, backward and recompute time, and the slowest layer calls.

  python3 scripts/trace_summary.py trace.json [--skip 1] [--layers 8]

While tracing, every layer call is waited for (on a GPU too), so a span is
the call's device time plus its launch. A step is the run of calls from one
call of the step's first layer to the next. The first --skip steps of each
rank are left out (the first step pays for warm-ups and autotuning). What
the spans leave out of the step (input upload, the loss, the update, the
allreduce) is not in these figures: compare the total with the step time
of the run's progress line.
"""
import argparse
import collections
import json
import statistics
import sys


def fail(path, why):
    sys.exit(f"trace_summary: {path}: {why}")


def load_calls(path):
    """rank -> list of (layer name, call kind, layer type, ms), in order."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        fail(path, f"cannot read it as JSON ({e})")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        fail(path, "no traceEvents list: not a trace of `vtrain train --trace`")
    tracks = {}  # (pid, tid) -> track name
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tracks[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name")
    calls = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or tracks.get((e.get("pid"), e.get("tid"))) != "compute":
            continue
        name, _, kind = str(e.get("name", "")).rpartition(" ")
        layer_type = e.get("args", {}).get("detail", "?")
        calls[e["pid"]].append((name, kind, layer_type, float(e.get("dur", 0)) / 1000.0))
    if not calls:
        fail(path, "no compute spans (a trace of `vtrain train --trace` has one per layer call)")
    return calls


def split_steps(calls):
    """The calls cut into steps at each call of the first layer's first kind."""
    first = calls[0][:2]
    steps = []
    for call in calls:
        if call[:2] == first:
            steps.append([])
        steps[-1].append(call)
    return steps


def summarize(rank, calls, skip, layers, out):
    steps = split_steps(calls)
    kept = steps[skip:] if len(steps) > skip else steps
    if kept is steps and skip:
        print(f"rank {rank}: only {len(steps)} step(s); none left out", file=out)
    kinds = ["forward", "backward", "recompute"]
    per_step = []  # per kept step: (layer type, kind) -> ms
    by_call = collections.defaultdict(list)
    for s in kept:
        per = collections.defaultdict(float)
        for name, kind, layer_type, ms in s:
            per[(layer_type, kind)] += ms
            by_call[f"{name} {kind}"].append(ms)
        per_step.append(per)
    median_total = statistics.median(sum(per.values()) for per in per_step)
    print(f"rank {rank}: {len(kept)} steps ({len(steps) - len(kept)} left out), "
          f"compute per step: median {median_total:.3f} ms", file=out)
    rows = []
    for layer_type in {t for per in per_step for t, _ in per}:
        # None where the type has no such call; 0 in a step without one.
        med = {k: statistics.median(per.get((layer_type, k), 0.0) for per in per_step)
               if any((layer_type, k) in per for per in per_step) else None for k in kinds}
        rows.append((sum(m for m in med.values() if m), layer_type, med))
    rows.sort(key=lambda r: -r[0])
    print(f"  {'type':<10} " + " ".join(f"{k:>9}" for k in kinds) + f" {'total':>9} {'share':>6}",
          file=out)
    for total, layer_type, med in rows:
        cells = " ".join(f"{med[k]:9.3f}" if med[k] is not None else f"{'-':>9}" for k in kinds)
        share = 100.0 * total / median_total if median_total else 0.0
        print(f"  {layer_type:<10} {cells} {total:9.3f} {share:5.1f}%", file=out)
    if layers > 0:
        slowest = sorted(((statistics.median(v), k) for k, v in by_call.items()), reverse=True)
        print(f"  slowest calls (median ms per step):", file=out)
        for ms, call in slowest[:layers]:
            print(f"    {ms:8.3f}  {call}", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="the file `vtrain train --trace FILE` wrote")
    ap.add_argument("--skip", type=int, default=1, help="first steps of each rank left out")
    ap.add_argument("--layers", type=int, default=8, help="slowest layer calls listed (0: none)")
    args = ap.parse_args()
    if args.skip < 0 or args.layers < 0:
        ap.error("--skip and --layers take 0 or more")
    calls = load_calls(args.trace)
    for rank in sorted(calls):
        summarize(rank, calls[rank], args.skip, args.layers, sys.stdout)


if __name__ == "__main__":
    main()
