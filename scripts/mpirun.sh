#!/usr/bin/env bash
# mpirun for vtrain on one machine: `scripts/mpirun.sh -np 2 build/vtrain CONFIG`.
# Adds what Open MPI needs to run as root (containers, CI) and in containers
# and otherwise passes everything through unchanged.
set -euo pipefail
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Containers often refuse the cross-process copy (CMA; it needs
# CAP_SYS_PTRACE) that Open MPI's shared-memory transport uses for large
# messages, and the allreduce then fails. Copy through the shared segment
# instead, unless the environment already chose.
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
# Open MPI gives each rank a pty, so a rank cannot tell whether this output
# is a terminal or a log file: say it, so that `output.progress: auto` draws
# a live line only on a terminal (a log file gets plain lines, no \r or ESC).
if [ -t 1 ]; then
  export VTRAIN_PROGRESS="${VTRAIN_PROGRESS:-live}"
fi
exec mpirun "$@"
