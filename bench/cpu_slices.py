"""CPU slices for the heterogeneity benchmarks: each rank in a cgroup of
its own with a CFS quota (what a container's CPU limit is), so that ranks
sharing a core get fixed, independent speeds. Without quotas, two ranks on
one core share it by the scheduler's whim: a rank that waits in the
allreduce gives its neighbour the whole core, so each one's speed depends
on the other's batch, which no per-device step-time curve can model.

Independent only while the quotas of the ranks on one core leave it
headroom: quotas that fill it (0.6 + 0.4) cannot both be met while both
slices run (the kernel, MPI and every other thread on that core take
their share too), so each gets less than its quota then, and its full
quota while the other waits. On the Intel Xeon the slices of 0.6 and 0.4
trained about 10% faster than they profiled, the lone core as profiled;
with 0.5 and 0.3 no side was consistently faster (bench/results/2026-11-26-cpu-xeon.md).
check_headroom() warns.

vtrain names a quota in the CPU device's identity ("... (cpus 1, cpu quota
0.6)"), so each slice is a device of its own in the perf DB.

Needs root and a writable cgroup filesystem (v1's cpu controller or v2 with
the cpu controller available); quota_cgroups() raises SystemExit naming
what is missing.
"""
import contextlib
import os

MIN_QUOTA_US = 1000  # the least quota (and period) the kernel accepts


def period_us(quotas):
    """The shortest CFS period that gives every quota at least the kernel's
    1 ms: a throttled rank waits at most (1 - quota) of a period at once,
    so the shorter the periods, the more evenly slow a slice is. With 5 ms
    periods a 0.4 slice stalled for up to 3 ms at a time, often inside the
    allreduce, where every rank waits on it; 0.4 gets 2.5 ms periods."""
    smallest = min(q for q in quotas if q is not None)
    return max(MIN_QUOTA_US, int(-(-MIN_QUOTA_US // smallest)))


def _cgroup_root():
    """(mount point, version) of the hierarchy carrying the cpu controller."""
    v1 = v2 = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3].split(",")
            if fstype == "cgroup" and "cpu" in options:
                v1 = fields[4]
            elif fstype == "cgroup2":
                v2 = fields[4]
    if v1:
        return v1, 1
    if v2 and os.path.exists(os.path.join(v2, "cgroup.controllers")):
        return v2, 2
    raise SystemExit("no cgroup hierarchy with the cpu controller is mounted: "
                     "--quotas needs one (and root)")


def _write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise SystemExit("cannot write %r to %s (%s): --quotas needs root and a writable "
                         "cgroup filesystem" % (text, path, e.strerror))


def parse_quotas(text, ranks):
    """"none,0.6,0.4" -> [None, 0.6, 0.4]: CPUs per rank, "none" for no quota."""
    items = [q.strip() for q in text.split(",")]
    if len(items) != ranks:
        raise SystemExit("--quotas %s: expected %d comma-separated values" % (text, ranks))
    quotas = []
    for q in items:
        if q == "none":
            quotas.append(None)
            continue
        try:
            value = float(q)
        except ValueError:
            value = 0
        if value <= 0:
            raise SystemExit("--quotas %s: %r is not a number of CPUs > 0 or 'none'" % (text, q))
        quotas.append(value)
    return quotas


@contextlib.contextmanager
def quota_cgroups(quotas):
    """Makes one cgroup per quota (None: no cgroup) and yields, per rank,
    the command prefix that starts a program in it ([] for none). Removes
    the cgroups on exit (their processes must have ended)."""
    made = []
    try:
        prefixes = []
        root, version = None, None
        period = period_us(quotas) if any(q is not None for q in quotas) else 0
        for r, quota in enumerate(quotas):
            if quota is None:
                prefixes.append([])
                continue
            if root is None:
                root, version = _cgroup_root()
                if version == 2:
                    _write(os.path.join(root, "cgroup.subtree_control"), "+cpu")
            path = os.path.join(root, "vtrain-bench-%d-rank%d" % (os.getpid(), r))
            os.mkdir(path)
            made.append(path)
            quota_us = int(round(quota * period))
            if version == 2:
                _write(os.path.join(path, "cpu.max"), "%d %d" % (quota_us, period))
            else:
                _write(os.path.join(path, "cpu.cfs_period_us"), str(period))
                _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota_us))
            prefixes.append(["sh", "-c", 'echo $$ > %s/cgroup.procs && exec "$@"' % path, "sh"])
        yield prefixes
    finally:
        for path in made:
            try:
                os.rmdir(path)
            except OSError:
                pass


# The benches' three ranks: rank r runs on core CORES[r] (rank 0 alone,
# ranks 1 and 2 sharing cpu 1).
CORES = (0, 1, 1)


def write_rankfile(path):
    """An Open MPI rankfile that pins every rank to its core in CORES."""
    with open(path, "w") as f:
        f.writelines("rank %d=localhost slot=%d\n" % (r, c) for r, c in enumerate(CORES))


def check_headroom(quotas):
    """Warns (on stdout) where the quotas of the ranks sharing a core
    (CORES) add up to more than 0.9 of it."""
    for core in sorted(set(CORES)):
        sharing = [r for r, c in enumerate(CORES) if c == core]
        total = sum(quotas[r] for r in sharing if quotas[r] is not None)
        if len(sharing) > 1 and total > 0.9:
            print("note: the quotas of ranks %s add up to %g of their shared core: with under "
                  "10%% of it left, each slice runs faster while the other waits than when both "
                  "run, so neither has one speed (cpu_slices.py); e.g. none,0.5,0.3 leaves headroom"
                  % (",".join(str(r) for r in sharing), total), flush=True)


def describe(quotas):
    """"rank 1 at 0.6 CPU, rank 2 at 0.4 CPU" (or "" without quotas)."""
    slices = ", ".join("rank %d at %g CPU" % (r, q) for r, q in enumerate(quotas) if q is not None)
    return slices and "%s (%g ms periods)" % (slices, period_us(quotas) / 1000.0)
