#!/usr/bin/env bash
# Packs what a GPU machine without a package registry needs (docs/gpu.md):
# the Debian runtime packages into .deps/debs (downloaded once) and the CUDA
# build's binaries, stripped, into .gpu/bin.tar.xz; both folders are kept
# out of git (.git/info/exclude). Run it here, after a build with the CUDA
# backend; carry ".deps" and ".gpu" to the machine and run
# bench/gpu_session.sh there.
#
#   bash scripts/gpu_pack.sh [BUILD_DIR]     (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bins=("$build/vtrain" "$build/tests/cuda_backend_test" "$build/tests/backend_conformance_test"
      "$build/bench/bench_memory" "$build/bench/bench_plans" "$build/bench/bench_cuda_ops")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "gpu_pack: $b is missing: build with the CUDA backend first" >&2; exit 2; }
done
grep -q '^/.deps/$' .git/info/exclude 2>/dev/null || printf '/.deps/\n/.gpu/\n' >> .git/info/exclude
mkdir -p .deps/debs .gpu
if ! ls .deps/debs/*.deb >/dev/null 2>&1; then
  (cd .deps/debs && apt-get download libdnnl2 ocl-icd-libopencl1 libglpk40 libamd2 \
    libcolamd2 libsuitesparseconfig5 libyaml-cpp0.7 libsqlite3-0 libopenmpi3 openmpi-bin \
    openmpi-common libhwloc15 libhwloc-plugins libpmix2 libevent-core-2.1-7 \
    libevent-pthreads-2.1-7 libevent-2.1-7 libfabric1 libucx0 libibverbs1 ibverbs-providers \
    librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libmunge2 \
    libltdl7 libnuma1 libgomp1 libgfortran5 dataset-fashion-mnist)
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "${bins[@]}" "$stage/"
strip "$stage"/*
tar cJf .gpu/bin.tar.xz -C "$stage" .
echo "gpu_pack: .gpu/bin.tar.xz $(du -h .gpu/bin.tar.xz | cut -f1), .deps/debs $(du -sh .deps/debs | cut -f1)"
