"""What the Python benchmarks share: running a command, and reading vtrain's
metrics file (--metrics, JSON lines) and Chrome traces (--trace)."""
import json
import subprocess
import sys


def run(cmd, env=None):
    """Runs `cmd`; its stdout (stderr kept apart, so that stdout can be
    parsed). On failure prints both and exits naming the command."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"command failed (exit {p.returncode}): {' '.join(cmd)}")
    return p.stdout


def records(path, event):
    """The {"event": EVENT, ...} objects of a metrics file, in order."""
    with open(path) as f:
        every = [json.loads(line) for line in f if line.strip()]
    return [r for r in every if r.get("event") == event]


def measured_rate(step):
    """Images per ms a step record's ranks computed at (each rank's batch
    over its compute_ms, added up): global batch / this rate is the step
    had the batch been split at exactly the rates the ranks ran at, with no
    exchange, the bound measured in the step itself rather than profiled."""
    return sum(b / c for b, c in zip(step["split"], step["compute_ms"]) if b > 0 and c > 0)


def end_record(path):
    """The last {"event": "end", ...} object of a metrics file; exits naming
    the file when there is none."""
    ends = records(path, "end")
    if not ends:
        raise SystemExit(f"no \"end\" record in vtrain's metrics file {path}")
    return ends[-1]


def layer_span_ms(trace_path, layers):
    """Per training step, the time the named layers' forward and backward
    spans took in a Chrome trace written by `vtrain train --trace`: for each
    span name ("conv1 forward", "conv1 backward", ...) the median over the
    traced steps after the first (which also creates every primitive),
    summed over the names. Rank 0's spans only."""
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    durations = {}
    for e in events:
        if e.get("ph") != "X" or e.get("pid", 0) != 0:
            continue
        layer, _, direction = e.get("name", "").rpartition(" ")
        if layer in layers and direction in ("forward", "backward"):
            durations.setdefault(e["name"], []).append(e["dur"] / 1000.0)
    if not durations:
        raise SystemExit(f"no spans of layers {sorted(layers)} in the trace {trace_path}")
    total = 0.0
    for spans in durations.values():
        steady = sorted(spans[1:] or spans)
        total += steady[len(steady) // 2]
    return total
