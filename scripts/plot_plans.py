#!/usr/bin/env python3
"""Memory against step-time overhead per memory plan, one panel per network,
from the CSV that `bench_plans --csv FILE` writes: each point is one plan at
one capacity (simulated peak in MiB, simulated step time as overhead over
`none`'s, or over the fastest plan's where `none` never fitted; measured
times drawn hollow, against the measured `none` or fastest plan).

    /usr/bin/python3 scripts/plot_plans.py plans.csv -o plans.png
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plotting  # noqa: E402

COLUMNS = ["net", "capacity", "plan", "sim_ms", "sim_mib", "solve_ms", "meas_ms", "meas_mib"]


def read_rows(path):
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != COLUMNS:
                plotting.fail(path, f"expected the columns {','.join(COLUMNS)} "
                                    f"(bench_plans --csv), got {reader.fieldnames}")
            rows = []
            for line, row in enumerate(reader, start=2):
                if not row["sim_ms"]:
                    continue  # that plan did not fit
                try:
                    rows.append({
                        "net": row["net"], "plan": row["plan"],
                        "sim_ms": float(row["sim_ms"]), "sim_mib": float(row["sim_mib"]),
                        "meas_ms": float(row["meas_ms"]) if row["meas_ms"] else None,
                        "meas_mib": float(row["meas_mib"]) if row["meas_mib"] else None,
                    })
                except ValueError as e:
                    plotting.fail(path, f"line {line}: {e}")
            return rows
    except OSError as e:
        plotting.fail(path, f"cannot read it ({e.strerror})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("-o", "--output", default="plans.png")
    parser.add_argument("--dpi", type=int, default=120)
    args = parser.parse_args()
    rows = read_rows(args.csv)
    if not rows:
        plotting.fail(args.csv, "no plan that fitted")
    nets = list(dict.fromkeys(r["net"] for r in rows))
    plt = plotting.pyplot()
    fig, axes = plt.subplots(1, len(nets), figsize=(5 * len(nets), 4), squeeze=False)
    for ax, net in zip(axes[0], nets):
        mine = [r for r in rows if r["net"] == net]
        base = min(r["sim_ms"] for r in mine if r["plan"] == "none") if any(
            r["plan"] == "none" for r in mine) else min(r["sim_ms"] for r in mine)
        measured_none = [r["meas_ms"] for r in mine if r["plan"] == "none" and r["meas_ms"]]
        measured_all = [r["meas_ms"] for r in mine if r["meas_ms"]]
        base_measured = (min(measured_none) if measured_none
                         else min(measured_all) if measured_all else base)
        for plan in dict.fromkeys(r["plan"] for r in mine):
            pts = [r for r in mine if r["plan"] == plan]
            line = ax.plot([r["sim_mib"] for r in pts],
                           [100 * (r["sim_ms"] / base - 1) for r in pts], "o", label=plan)[0]
            measured = [r for r in pts if r["meas_ms"] is not None]
            if measured:
                ax.plot([r["meas_mib"] for r in measured],
                        [100 * (r["meas_ms"] / base_measured - 1) for r in measured], "o",
                        mfc="none", color=line.get_color())
        ax.set_title(net)
        ax.set_xlabel("peak device memory (MiB)")
        ax.set_ylabel("step time over none (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    plotting.save(fig, args.output, args.dpi)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
