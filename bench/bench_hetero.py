#!/usr/bin/python3
"""Heterogeneity end to end on one small box (issues 5 and 14).

Three ranks under an Open MPI rankfile: rank 0 has a core to itself, ranks
1 and 2 share the other (they profile together, so their profile is the
shared core's under the contention training meets). With --speeds 3, rank 2
runs under `nice -n 5`, so when both compete it gets about a quarter of the
shared core and rank 1 three quarters. (Not a true third speed for the
balancer: ranks 1 and 2 are one device to the perf DB, same CPU and
cpuset, so they share one profile and the balancer cannot give the niced
rank less.) Every rank profiles into one perf
DB; then training runs alternate between the splits and the script prints,
per split, the median measured step time, images/s, and the throughput as
a percentage of the ideal bound (the plan's ideal_step_ms: every device's
best standalone throughput added up, less the exchange), and the ILP's
optimum: the split's predicted step as a percentage of that bound:

  even      the even split
  static    balance.split: auto, the balancer's split of the profiled steps
  excluded  (--memory-limit) rank 0 limited to SIZE with memory.policy none:
            the best split among batches that fit without offload
  joint     (--memory-limit) rank 0 limited to SIZE with memory.policy auto:
            batches above the limit are candidates at their plan's time

  /usr/bin/python3 bench/bench_hetero.py [--vtrain build/vtrain] [--rounds 3]
      [--speeds 2|3] [--config configs/synthetic-lenet.yaml] [--batch 96]
      [--memory-limit 12MiB] [--step-rounds 3] [--quotas none,0.5,0.3] [--granularity 8]
      [--db perf.db] [--splits static,...] [--log-every 1]

--db keeps the profile: a second run with the same options and DB trains
at once (profiling the 3-speed mix takes minutes). --splits times only
those. --log-every 1 records every step, and the table then splits rank
0's step into the slowest rank's compute and the rest (the step records'
step_ms and compute_ms): the time the split's model prices as the
exchange, where a throttled slice also waits for its quota. It also
prints each step against the bound at the rates its ranks computed at in
that step (vtrain_metrics.measured_rate): the split's balance as trained,
apart from the profile, which the VM may have run faster or slower than
training (the plan's bound comes from the profile).

With --quotas each rank runs in a cgroup of its own with that CFS quota
(cpu_slices.py; needs root): ranks 1 and 2 then share cpu 1 at fixed,
independent speeds, and each is a device of its own in the perf DB (the
quota is part of a CPU device's identity), a true 3-speed mix.

With --gpu two ranks share the machine's GPU (issue 14's GPU figure:
one GPU, two processes, rank 0 under --memory-limit), so that the joint
split's offload and recompute run for real; they sum gradients over MPI
through pinned host memory (NCCL needs a GPU per rank). E.g.

  /usr/bin/python3 bench/bench_hetero.py --gpu --config configs/cifar10-resnet18.yaml \
      --set data.kind=synthetic --batch 512 --memory-limit 2GiB \
      --profile-batches 64,128,192,256,320,384,448

Timings on a shared 2-vCPU VM are noisy: the runs alternate and the
medians are quoted.
"""
import argparse
import os
import re
import statistics
import sys
import tempfile

from cpu_slices import check_headroom, describe, parse_quotas, quota_cgroups, write_rankfile
from vtrain_metrics import end_record, measured_rate, records, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_ms(metrics_path, batch):
    end = end_record(metrics_path)
    if end["images_per_second"] <= 0:
        sys.exit("no throughput in the end record of " + metrics_path)
    return 1000.0 * batch / end["images_per_second"]


def step_parts(metrics_path):
    """(rank 0's step, the slowest rank's compute, the rest, the measured
    bound) in ms, one per step record with every rank's compute_ms, the
    first step (which creates every primitive) left out. The measured
    bound is the step at the rates the ranks computed at in it
    (measured_rate)."""
    parts = []
    for r in records(metrics_path, "step"):
        if r["step"] > 1 and r.get("compute_ms") and "step_ms" in r:
            slowest = max(r["compute_ms"])
            bound = sum(r["split"]) / measured_rate(r)
            parts.append((r["step_ms"], slowest, r["step_ms"] - slowest, bound))
    return parts


def plan_number(plan_path, key):
    match = re.search(r"^%s: ([0-9.e+-]+)" % key, open(plan_path).read(), re.M)
    return float(match.group(1)) if match else None


def launch(args, rankfile, per_rank, prefixes):
    """mpirun of the ranks as one MPMD line: per_rank[r] is rank r's extra
    arguments, prefixes[r] what starts it in its CPU slice (cpu_slices.py);
    rank 2 runs under nice with --speeds 3. With --gpu no rankfile."""
    cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "--oversubscribe"]
    if not args.gpu:
        cmd += ["--rankfile", rankfile]
    for r in range(len(per_rank)):
        if r > 0:
            cmd.append(":")
        cmd += ["-np", "1"] + prefixes[r]
        if r == 2 and args.speeds == 3:
            cmd += ["nice", "-n", "5"]
        cmd += [args.vtrain] + per_rank[r]
    return cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vtrain", default=os.path.join(ROOT, "build", "vtrain"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "synthetic-lenet.yaml"))
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--steps", type=int, default=40,
                    help="training steps per run (the synthetic data set is sized to them)")
    ap.add_argument("--granularity", type=int, default=8,
                    help="balance.granularity: every rank's batch a multiple of this")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--speeds", type=int, choices=[2, 3], default=2)
    ap.add_argument("--memory-limit", default="",
                    help="device.memory_limit of rank 0 for the excluded and joint splits")
    ap.add_argument("--profile-batches", default="8,16,24,32,40,48,56,64,72,80")
    ap.add_argument("--step-rounds", type=int, default=3,
                    help="profile.step_rounds: rounds over the batches' profiled steps")
    ap.add_argument("--gpu", action="store_true",
                    help="two ranks on the machine's GPU (device.backend cuda, conv.algorithm auto)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every rank (repeatable)")
    ap.add_argument("--db", default="",
                    help="the perf DB to profile into (default: a new one in the run's temporary "
                         "folder); one the same options profiled before is reused as it is")
    ap.add_argument("--splits", default="",
                    help="comma-separated splits to time (default: every one that applies)")
    ap.add_argument("--log-every", type=int, default=0,
                    help="train.log_every: with 1, every step is recorded and the table adds the "
                         "slowest rank's compute and the rest of each step (step_ms, compute_ms)")
    ap.add_argument("--quotas", default="",
                    help="per rank, a CPU quota in a cgroup of its own ('none' for none), e.g. "
                         "none,0.5,0.3: fixed, independent speeds for ranks 1 and 2 (cpu_slices.py)")
    args = ap.parse_args()
    if args.gpu and (args.quotas or args.speeds != 2):
        ap.error("--gpu takes neither --quotas nor --speeds")
    args.ranks = 2 if args.gpu else 3
    quotas = parse_quotas(args.quotas, 3) if args.quotas else [None] * args.ranks
    if args.quotas:
        check_headroom(quotas)
    with quota_cgroups(quotas) as prefixes:
        bench(args, quotas, prefixes)


def bench(args, quotas, prefixes):

    env = dict(os.environ, OMPI_MCA_btl="self,vader",
               # Ranks 1 and 2 share a core: a rank waiting in MPI must yield it
               # instead of spinning, or it steals the core from the other.
               OMPI_MCA_mpi_yield_when_idle="1")
    work = tempfile.mkdtemp(prefix="vtrain-hetero.")
    rankfile = os.path.join(work, "rankfile")
    write_rankfile(rankfile)
    db = os.path.abspath(args.db) if args.db else os.path.join(work, "perf.db")
    common = ["--progress", "off",
              "--set", "train.batch=%d" % args.batch, "--set", "train.max_steps=%d" % args.steps,
              "--set", "train.evaluate=false", "--set", "profile.db=" + db,
              # One epoch of exactly --steps steps (the first, which creates the
              # primitives, is not timed): the config's own data set would end
              # a run of a large batch after a handful of steps.
              "--set", "data.train_size=%d" % (args.batch * args.steps), "--set", "train.epochs=1",
              "--set", "profile.batches=[%s]" % args.profile_batches,
              "--set", "profile.step_rounds=%d" % args.step_rounds,
              "--set", "balance.granularity=%d" % args.granularity, "--set", "balance.candidates=interpolated",
              "--set", "balance.rebalance.enabled=false"]
    if args.gpu:
        common += ["--set", "device.backend=cuda", "--set", "conv.algorithm=auto"]
    else:
        common += ["--set", "device.threads=1", "--set", "conv.algorithm=direct"]
    if args.log_every:
        common += ["--set", "train.log_every=%d" % args.log_every]
    for setting in args.set:
        common += ["--set", setting]
    limit = ["--set", "device.memory_limit=" + args.memory_limit]

    # Each split: its mode and per-rank settings.
    splits = {"even": ("even", []), "static": ("auto", [])}
    if args.memory_limit:
        splits["excluded"] = ("auto", ["--set", "memory.policy=none"])
        splits["joint"] = ("auto", ["--set", "memory.policy=auto"])
    if args.splits:
        wanted = args.splits.split(",")
        unknown = [w for w in wanted if w not in splits]
        if unknown:
            raise SystemExit("--splits: %s is not one of %s" % (",".join(unknown), ",".join(splits)))
        splits = {name: splits[name] for name in wanted}

    def per_rank(command, name, extra):
        ranks = [[command, args.config] + common + splits[name][1] + extra
                 for _ in range(args.ranks)]
        if name in ("excluded", "joint"):
            ranks[0] += limit
        return ranks

    who = "rank 0 alone on cpu 0, ranks 1 and 2 sharing cpu 1"
    if args.gpu:
        who = "ranks 0 and 1 sharing the GPU"
    if args.speeds == 3:
        who += ", rank 2 at nice 5"
    if any(quotas):
        who += ", " + describe(quotas)
    print("profiling %d ranks (%s) ..." % (args.ranks, who), flush=True)
    for name in splits:
        if name in ("even", "excluded"):  # static shares even's profile (policy none, no limit)
            continue
        out = run(launch(args, rankfile, per_rank("profile", name, []), prefixes), env)
        print("\n".join("  %s: %s" % (name, l.strip()) for l in out.splitlines()
                        if "share" in l or "together" in l or "fits no plan" in l))

    times = {name: [] for name in splits}
    parts = {name: [] for name in splits}
    ideal = {name: [] for name in splits}
    predicted = {name: [] for name in splits}
    split_text = {}
    for r in range(args.rounds):
        for name, (mode, _) in splits.items():
            metrics = os.path.join(work, "m-%s-%d.jsonl" % (name, r))
            plan = os.path.join(work, "plan-%s.yaml" % name)
            extra = ["--set", "balance.split=" + mode, "--metrics", metrics,
                     "--set", "output.plan=" + plan]
            out = run(launch(args, rankfile, per_rank("train", name, extra), prefixes), env)
            times[name].append(step_ms(metrics, args.batch))
            parts[name] += step_parts(metrics)
            note = ""
            if mode == "auto":
                split_text[name] = re.search(r"plan: split (\S+)", out).group(1)
                ideal[name].append(plan_number(plan, "ideal_step_ms"))
                predicted[name].append(plan_number(plan, "predicted_step_ms"))
                note = " (split %s, predicted %.2f ms)" % (split_text[name], predicted[name][-1])
            print("  round %d %-8s %.2f ms/step%s" % (r + 1, name, times[name][-1], note),
                  flush=True)

    planned = [name for name in splits if ideal[name]]
    bound = statistics.median(ideal[planned[0]]) if planned else None
    if bound:
        print("ideal bound (%s's plan): %.2f ms/step, %.0f images/s"
              % (planned[0], bound, 1e3 * args.batch / bound))
    print("%-9s %-12s %10s %9s %14s %14s" % ("split", "batches", "ms/step", "images/s",
                                             "% of bound", "ILP optimum"))
    for name in splits:
        ms = statistics.median(times[name])
        own = statistics.median(ideal[name]) if ideal[name] else bound
        batches = split_text.get(name, "even")
        share = "%13.1f%%" % (100.0 * own / ms) if own else "%14s" % "-"
        # The split's own prediction against the bound: the ILP's optimum.
        optimum = ("%13.1f%%" % (100.0 * own / statistics.median(predicted[name]))
                   if predicted[name] else "%14s" % "-")
        print("%-9s %-12s %10.2f %9.0f %s %s"
              % (name, batches, ms, 1e3 * args.batch / ms, share, optimum))
    if any(parts.values()):
        print("per step (medians over every round's steps): rank 0's step = the slowest rank's "
              "compute + the rest (exchange, waiting, update); the bound at the rates the ranks "
              "computed at in the step (no exchange), and the step's throughput against it")
        for name in splits:
            if parts[name]:
                step, slowest, rest, measured = (statistics.median(p) for p in zip(*parts[name]))
                share = statistics.median(100.0 * p[3] / p[0] for p in parts[name])
                print("%-9s %8.2f ms = %8.2f + %6.2f ms; measured bound %8.2f ms, %5.1f%% (%d steps)"
                      % (name, step, slowest, rest, measured, share, len(parts[name])))
    if "even" in splits and "static" in splits:
        e = statistics.median(times["even"])
        print("speedup of the static split over even: %.2fx" % (e / statistics.median(times["static"])))
    if "excluded" in splits and "joint" in splits:
        x, j = statistics.median(times["excluded"]), statistics.median(times["joint"])
        print("joint split vs the best split excluding batches above %s: %.2fx (%.2f vs %.2f ms)"
              % (args.memory_limit, x / j, j, x))
    print("metrics files and plans: " + work)


if __name__ == "__main__":
    main()
