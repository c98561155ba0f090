#!/usr/bin/python3
"""Device-memory timeline of vtrain Chrome traces, drawn to a PNG like the
per-layer memory figures of the vDNN paper.

    /usr/bin/python3 scripts/plot_memory.py TRACE.json [TRACE2.json ...] -o memory.png
                                            [--rank R] [--title T]

TRACE.json comes from `vtrain train --trace FILE` (the first steps of every
rank, one process per rank) or `bench_memory --trace-dir DIR` (DIR/NET-POLICY.json,
e.g. vgg16-all.json, rank 0). Each file is one line, labelled by its stem:
x = ms since the rank's first event, y = MiB in use on the device (the step
function of the "device bytes in use" counter, args.bytes). The offload and
prefetch spans of the "memory stream" track (cat "offload" / "prefetch") are
shaded under the lines: full height for one file, a thin band per file for
several. Prints one line per file: peak MiB, time-weighted mean MiB and the
number of offload and prefetch spans. Exit status 2 on an unreadable trace.
Needs matplotlib (Debian: apt-get install python3-matplotlib)."""
import argparse
import json
import os

from plotting import MIB, fail, pyplot, save

COUNTER = "device bytes in use"  # worker/network.cpp: trace_->counter(...)
MEMORY_TRACK = "memory stream"    # worker/network.cpp: trace_->span("memory stream", ...)
COPY_COLOURS = {"offload": "#9ecae1", "prefetch": "#fdd0a2"}


def load(path, rank):
    """The counter samples [(ms, MiB)] and copy spans {cat: [(ms, ms)]} of `rank` in `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        fail(path, f"cannot read it ({e.strerror})")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        fail(path, f"not valid JSON ({e})")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        fail(path, "not a Chrome trace (no \"traceEvents\" list)")
    events = [e for e in events if isinstance(e, dict)]
    tracks = {e.get("tid"): e.get("args", {}).get("name") for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == rank}
    mine = [e for e in events if e.get("pid") == rank and isinstance(e.get("ts"), (int, float))]
    samples = sorted((e["ts"], e.get("args", {}).get("bytes")) for e in mine
                     if e.get("ph") == "C" and e.get("name") == COUNTER)
    if not samples or any(not isinstance(b, (int, float)) for _, b in samples):
        ranks = sorted({e.get("pid") for e in events if e.get("ph") == "C" and e.get("name") == COUNTER},
                       key=str)
        where = f" (ranks with it: {', '.join(map(str, ranks))})" if ranks else ""
        fail(path, f"no \"{COUNTER}\" counter (args.bytes) for rank {rank}{where}")
    origin = min(e["ts"] for e in mine)
    points = [((ts - origin) / 1000.0, b / MIB) for ts, b in samples]
    # The last value holds until the trace's last event (a policy that
    # allocates nothing during steps has one sample).
    end = max(e["ts"] + e.get("dur", 0) for e in mine)
    if (end - origin) / 1000.0 > points[-1][0]:
        points.append(((end - origin) / 1000.0, points[-1][1]))
    spans = {cat: [] for cat in COPY_COLOURS}
    for e in mine:
        if e.get("ph") == "X" and e.get("cat") in spans and tracks.get(e.get("tid")) == MEMORY_TRACK:
            start = (e["ts"] - origin) / 1000.0
            spans[e["cat"]].append((start, e.get("dur", 0) / 1000.0))
    return points, spans


def summary(points):
    """Peak and time-weighted mean MiB of a step function sampled at `points`."""
    peak = max(v for _, v in points)
    span = points[-1][0] - points[0][0]
    if span <= 0:
        return peak, points[-1][1]
    area = sum(v * (t1 - t0) for (t0, v), (t1, _) in zip(points, points[1:]))
    return peak, area / span


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACE.json")
    p.add_argument("-o", "--output", required=True, metavar="PNG")
    p.add_argument("--rank", type=int, default=0, help="the process (pid) to draw (default 0)")
    p.add_argument("--title", default="device memory in use")
    a = p.parse_args()
    runs = []
    for path in a.traces:
        points, spans = load(path, a.rank)
        label = os.path.splitext(os.path.basename(path))[0]
        peak, mean = summary(points)
        print(f"{label:24} peak {peak:10.1f} MiB  mean {mean:10.1f} MiB  "
              f"offload {len(spans['offload']):5}  prefetch {len(spans['prefetch']):5}")
        runs.append((label, points, spans))
    plt = pyplot()
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(11, 5))
    band = 1.0 if len(runs) == 1 else 0.04
    shaded = set()
    for i, (label, points, spans) in enumerate(runs):
        xs, ys = zip(*points)
        (line,) = ax.step(xs, ys, where="post", label=label, linewidth=1.2, zorder=3)
        edge = line.get_color() if len(runs) > 1 else "none"  # which file a band belongs to
        for cat, ranges in spans.items():  # y in axes units: full height or a band per file
            if ranges:
                ax.broken_barh(ranges, (i * band * 1.25, band), facecolors=COPY_COLOURS[cat],
                               edgecolors=edge, alpha=0.6, transform=ax.get_xaxis_transform(), zorder=1)
                shaded.add(cat)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(color=COPY_COLOURS[c], alpha=0.6, label=c) for c in COPY_COLOURS if c in shaded]
    ax.legend(handles=handles, loc="upper right", fontsize="small")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("device memory in use (MiB)")
    ax.set_title(a.title + (f" (rank {a.rank})" if a.rank else ""))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, a.output, dpi=120)


if __name__ == "__main__":
    main()
