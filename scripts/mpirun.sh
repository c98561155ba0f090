#!/usr/bin/env bash
# mpirun for vtrain on one machine: `scripts/mpirun.sh -np 2 build/vtrain CONFIG`.
# Adds what Open MPI needs to run as root (containers, CI) and otherwise
# passes everything through unchanged.
set -euo pipefail
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun "$@"
