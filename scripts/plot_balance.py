#!/usr/bin/python3
"""Draws what the balancer decided: the per-device split of the batch with
each device's predicted step time, and (with --fronts) one convolution
kernel's Pareto front of time x workspace with the configuration the plan
chose.

    build/vtrain balance CONFIG --db perf.db --policy wd --workspace 64MiB \\
        --out plan.yaml --fronts fronts.csv
    /usr/bin/python3 scripts/plot_balance.py plan.yaml --fronts fronts.csv -o balance.png \\
        [--rank 0] [--kernel conv2/Forward]

Without --kernel the front drawn is the one with the most points on that
rank. Needs python3-yaml and python3-matplotlib (Debian). Errors name the
file and what is wrong, exit code 2.
"""
import argparse
import csv

from plotting import MIB, fail, pyplot, save


def load_plan(path):
    try:
        import yaml
    except ImportError:
        fail("python3-yaml", "not installed (Debian: apt-get install python3-yaml)")
    try:
        with open(path) as f:
            plan = yaml.safe_load(f)
    except OSError as e:
        fail(path, f"cannot read it ({e.strerror})")
    except yaml.YAMLError as e:
        fail(path, f"not valid YAML ({e})")
    if not isinstance(plan, dict) or plan.get("vtrain_plan") is None or not plan.get("ranks"):
        fail(path, "not a vtrain plan (no vtrain_plan / ranks)")
    return plan


def load_fronts(path, rank):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        fail(path, f"cannot read it ({e.strerror})")
    need = {"rank", "kernel", "workspace_bytes", "time_ms", "calls", "chosen"}
    if not rows or not need <= set(rows[0]):
        fail(path, f"not a --fronts CSV (columns {', '.join(sorted(need))})")
    fronts = {}
    for line, r in enumerate(rows, start=2):
        try:
            if int(r["rank"]) != rank:
                continue
            point = (float(r["workspace_bytes"]) / MIB, float(r["time_ms"]), r["calls"], r["chosen"] == "1")
        except ValueError:
            fail(f"{path}:{line}", "a number is malformed")
        fronts.setdefault(r["kernel"], []).append(point)
    if not fronts:
        fail(path, f"no front points for rank {rank}")
    return fronts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", metavar="PLAN.yaml")
    p.add_argument("--fronts", metavar="CSV", help="from `vtrain balance --fronts`")
    p.add_argument("--rank", type=int, default=0, help="whose kernel front to draw (default 0)")
    p.add_argument("--kernel", help="e.g. conv2/Forward (default: the longest front)")
    p.add_argument("-o", "--output", required=True, metavar="PNG")
    a = p.parse_args()
    plan = load_plan(a.plan)
    fronts = load_fronts(a.fronts, a.rank) if a.fronts else None
    if fronts is not None:
        kernel = a.kernel or max(fronts, key=lambda k: len(fronts[k]))
        if kernel not in fronts:
            fail(a.fronts, f"no kernel '{kernel}' on rank {a.rank} (known: {', '.join(sorted(fronts))})")
    plt = pyplot()

    fig, axes = plt.subplots(1, 2 if fronts else 1, figsize=(12 if fronts else 6, 4.5), squeeze=False)
    ax = axes[0][0]
    ranks = plan["ranks"]
    names = [f"rank {i}\n{str(r.get('device', ''))[:24]}" for i, r in enumerate(ranks)]
    batches = [int(r.get("batch", 0)) for r in ranks]
    bars = ax.bar(range(len(ranks)), batches, color="tab:blue")
    for bar, r in zip(bars, ranks):
        ms = r.get("predicted_ms")
        if ms is not None and int(r.get("batch", 0)) > 0:
            ax.annotate(f"{float(ms):.1f} ms", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(ranks)))
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylabel("samples per step")
    title = f"split of {plan.get('global_batch')} ({plan.get('workspace_policy')})"
    if plan.get("split_ms") and plan.get("even_split_ms"):
        title += f": {float(plan['split_ms']):.1f} ms vs even {float(plan['even_split_ms']):.1f} ms"
    ax.set_title(title, fontsize=10)
    print(f"split: {batches}, predicted step {float(plan.get('predicted_step_ms', 0)):.2f} ms")

    if fronts:
        ax = axes[0][1]
        points = sorted(fronts[kernel])
        xs, ys = [pt[0] for pt in points], [pt[1] for pt in points]
        ax.step(xs, ys, where="post", color="tab:gray", linewidth=1, zorder=1)
        ax.scatter(xs, ys, color="tab:blue", s=18, zorder=2, label="Pareto front")
        for x, y, calls, chosen in points:
            if chosen:
                ax.scatter([x], [y], color="tab:red", s=60, zorder=3, label=f"chosen: {calls}")
        ax.set_xlabel("workspace (MiB)")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"rank {a.rank} {kernel}: {len(points)} configurations", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        print(f"front {kernel} (rank {a.rank}): {len(points)} points, "
              f"{xs[0]:.2f}-{xs[-1]:.2f} MiB, {ys[-1]:.3f}-{ys[0]:.3f} ms")
    fig.tight_layout()
    save(fig, a.output, dpi=110)


if __name__ == "__main__":
    main()
