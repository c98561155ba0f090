#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for vtrain and builds it into build/.
#
#   bash scripts/setup.sh          install what the main job needs (if missing)
#                                  and build build/vtrain alone
#   bash scripts/setup.sh --test   also install what the tests need, build every
#                                  target (tests, benchmarks) and run ctest
#
# Idempotent: packages already present are not reinstalled, and the build is
# incremental. Needs root or sudo for apt-get. Environment: VTRAIN_CUDA
# (AUTO|ON|OFF, default AUTO), VTRAIN_BUILD_TYPE (default Release),
# VTRAIN_JOBS (default: number of cores).
set -euo pipefail

cd "$(dirname "$0")/.."
run_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) run_tests=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

# To build vtrain (the configure step finds GoogleTest too) and run the main
# job, LeNet on Fashion-MNIST.
packages=(
  build-essential cmake ninja-build pkg-config
  libyaml-cpp-dev libsqlite3-dev libglpk-dev
  libopenmpi-dev openmpi-bin libdnnl-dev ocl-icd-opencl-dev libgtest-dev zlib1g-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev nlohmann-json3-dev libonnx-dev libprotobuf-dev
  dataset-fashion-mnist
)
# What the tests use besides: the sqlite3 and GLPK shells, python3 for the
# scripts they run, iproute2 and nftables (hosts, links and packet loss for
# the multi-host tests), munge + SLURM for the SLURM test, and Debian's
# PyTorch, torchvision and Pillow (the model-export and image-data tests
# compare against them).
if ((run_tests)); then
  packages+=(sqlite3 glpk-utils python3 iproute2 nftables munge slurmctld slurmd slurm-client
             python3-torch python3-torchvision python3-pil python3-numpy python3-venv)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# Where the CUDA toolkit is installed the CUDA backend must build (a missing
# cuDNN or NCCL is then an error, not a silently CPU-only build); elsewhere
# it is left out. VTRAIN_CUDA=OFF|ON|AUTO overrides.
cuda=AUTO
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
cmake -S . -B build -G Ninja \
  -DCMAKE_BUILD_TYPE="${VTRAIN_BUILD_TYPE:-Release}" \
  -DVTRAIN_CUDA="${VTRAIN_CUDA:-$cuda}" "${launcher[@]}" >/dev/null
# The main job needs vtrain alone; the tests need every target.
targets=(--target vtrain)
if ((run_tests)); then targets=(); fi
cmake --build build -j "${VTRAIN_JOBS:-$(nproc)}" "${targets[@]}"
echo "setup: built build/vtrain"

if ((run_tests)); then
  # ONNX Runtime, the ONNX checker and safetensors come from PyPI, into a
  # venv beside Debian's packages (numpy kept below 2: Debian's torch is
  # built against numpy 1; versions pinned to those tested). The tests find it
  # as build/pyenv/bin/python.
  if ! build/pyenv/bin/python -c "import onnxruntime, onnx, safetensors" 2>/dev/null; then
    /usr/bin/python3 -m venv --system-site-packages build/pyenv
    build/pyenv/bin/pip install -q "numpy<2" onnxruntime==1.32.0 onnx==1.23.2 safetensors==0.8.0
  fi
  # Open MPI refuses root unless told; CI runs as root.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  ctest --test-dir build --output-on-failure -j "${VTRAIN_JOBS:-$(nproc)}" --timeout 1200
fi
