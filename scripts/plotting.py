"""What the plot scripts share: errors that name the file, matplotlib
without a display, and saving a figure. Imported by scripts/plot_*.py."""
import os
import sys

MIB = 1024.0 * 1024.0


def fail(path, why):
    """Prints "SCRIPT: PATH: WHY" to stderr and exits with status 2."""
    print(f"{os.path.basename(sys.argv[0])}: {path}: {why}", file=sys.stderr)
    sys.exit(2)


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail("matplotlib", "not installed (Debian: apt-get install python3-matplotlib)")
    return plt


def save(fig, path, dpi):
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        fail(path, f"cannot write it ({e.strerror})")
