#!/usr/bin/env bash
# One call on a lent GPU machine (docs/gpu.md), after scripts/gpu_pack.sh
# here: unpacks the binaries carried in .gpu/bin.tar.xz, runs the parts of
# bench/gpu_figures.sh in the order given, each stopped after SECONDS
# (default 170), and leaves every log in OUT_DIR/logs.tgz: a call returns 8
# files at most, and what a stopped call left under OUT_DIR still returns,
# so the tarball is rewritten after every part. Put the parts that check
# correctness first.
#
#   bash bench/gpu_session.sh OUT_DIR PART[,PART...] [SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1 parts=$2
export VTRAIN_PART_TIMEOUT=${3:-170}
logs=$(mktemp -d)
mkdir -p .gpu/bin "$out"
tar xJf .gpu/bin.tar.xz -C .gpu/bin || { echo "gpu_session: no .gpu/bin.tar.xz (scripts/gpu_pack.sh)" >&2; exit 2; }
export PMIX_MCA_pcompress_base_silence_warning=1
IFS=, read -ra names <<< "$parts"
for name in "${names[@]}"; do
  bash bench/gpu_figures.sh .gpu/bin "$logs" "$name" 2>&1 | tee -a "$logs/session.log"
  tar czf "$out/logs.tgz.part" -C "$logs" . && mv "$out/logs.tgz.part" "$out/logs.tgz"
done
grep -HE '^\[  PASSED  \]|FAILED TESTS' "$logs"/*.log 2>/dev/null
