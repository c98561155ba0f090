#!/usr/bin/python3
"""Per-rank compute time and batch over the steps of a run that re-balanced
(bench/bench_rebalance.py's metrics file, train.log_every=1).

  /usr/bin/python3 scripts/plot_rebalance.py rebalance.jsonl [--out docs/rebalance-cpu.png]
"""
import argparse
import json

from plotting import fail, pyplot, save


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics")
    ap.add_argument("--out", default="docs/rebalance-cpu.png")
    ap.add_argument("--slow-at", type=int, default=200, help="the step the slowdown began")
    args = ap.parse_args()
    steps, switches = [], []
    try:
        with open(args.metrics) as f:
            for line in f:
                r = json.loads(line)
                if r["event"] == "step" and r.get("compute_ms"):
                    steps.append(r)
                elif r["event"] == "rebalance":
                    switches.append(r["step"])
    except (OSError, ValueError) as e:
        fail(args.metrics, f"cannot read it ({e})")
    if not steps:
        fail(args.metrics, "no step records with per-rank compute times")
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 5.5))
    x = [s["step"] for s in steps]
    for r in range(len(steps[0]["split"])):
        top.plot(x, [s["compute_ms"][r] for s in steps], lw=0.8, label=f"rank {r}")
        bottom.step(x, [s["split"][r] for s in steps], where="post", label=f"rank {r}")
    for ax in (top, bottom):
        ax.axvline(args.slow_at, color="grey", ls="--", lw=0.8)
        for s in switches:
            ax.axvline(s, color="black", ls=":", lw=0.8)
    top.set_ylabel("compute per step (ms)")
    top.set_title("rank 0 2x slower from step %d (dashed); re-balanced (dotted)" % args.slow_at)
    top.legend(loc="upper left")
    bottom.set_ylabel("batch (samples)")
    bottom.set_xlabel("step")
    fig.tight_layout()
    save(fig, args.out, 120)
    print("wrote " + args.out)


if __name__ == "__main__":
    main()
