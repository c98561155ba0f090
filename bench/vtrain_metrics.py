"""Reading vtrain's metrics file (--metrics, JSON lines) in the benchmarks."""
import json


def end_record(path):
    """The last {"event": "end", ...} object of a metrics file; exits naming
    the file when there is none."""
    end = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                record = json.loads(line)
                if record.get("event") == "end":
                    end = record
    if end is None:
        raise SystemExit(f"no \"end\" record in vtrain's metrics file {path}")
    return end
