# Source this on a GPU machine that has the CUDA toolkit and PyTorch's
# NVIDIA wheels but no package registry (see docs/gpu.md): it unpacks the
# Debian runtime packages carried in .deps/debs into /tmp/vtrain-deps (never
# into /) and points the loader at them and at the wheels' cuDNN, cuBLAS and
# NCCL.
#
#   . scripts/gpu_env.sh && build/vtrain configs/synthetic-lenet.yaml --set device.backend=cuda
_vtrain_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_vtrain_deps=/tmp/vtrain-deps
if [ ! -d "$_vtrain_deps/usr" ]; then
  for f in "$_vtrain_root"/.deps/debs/*.deb; do dpkg -x "$f" "$_vtrain_deps"; done
fi
_vtrain_lib=$_vtrain_deps/usr/lib/x86_64-linux-gnu
export OPAL_PREFIX=$_vtrain_deps/usr          # relocated Open MPI
export PATH=$_vtrain_deps/usr/bin:$PATH
_vtrain_wheels=$(python3 -c 'import nvidia, os; print(nvidia.__path__[0])' 2>/dev/null || true)
_vtrain_ld=$_vtrain_lib:$_vtrain_lib/openmpi/lib
for d in cudnn nccl cublas cuda_runtime cu13; do
  [ -n "$_vtrain_wheels" ] && [ -d "$_vtrain_wheels/$d/lib" ] && _vtrain_ld=$_vtrain_ld:$_vtrain_wheels/$d/lib
done
export LD_LIBRARY_PATH=$_vtrain_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset _vtrain_root _vtrain_deps _vtrain_lib _vtrain_wheels _vtrain_ld
