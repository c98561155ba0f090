#!/usr/bin/env bash
# The CUDA backend's tests and GPU figures in one go (issue 7), for a GPU
# machine set up as docs/gpu.md describes. Writes one log per part to DIR.
#
#   bash bench/gpu_figures.sh BIN_DIR OUT_DIR [PART,PART,...]
#
# Parts (default all): gpu_tests cuda_ops conformance_gpu train_vs_torch vdnn_vgg16_b64 vdnn_vgg16_b128
# vdnn_vgg16_b256 dyn_limit_vgg16 wr_wd_alexnet alexnet_fronts
# precisions_vs_torch graph_vs_torch vgg16_vs_amp prefetch fuse_relu graph_engines breakdown_gpu breakdown_vgg16 pseudo_half accuracy_parity layouts
# plans_gpu joint_split_gpu. Each takes one to three
# minutes on an H100 but precisions_vs_torch (four models in four
# precisions, about 15). accuracy_parity reads Fashion-MNIST from the
# dataset-fashion-mnist package carried with the others (docs/gpu.md). alexnet_fronts writes the plans and fronts CSVs
# to OUT_DIR; draw them where matplotlib is installed with
#   /usr/bin/python3 scripts/plot_balance.py OUT_DIR/plan-wd.yaml \
#     --fronts OUT_DIR/fronts-wd.csv -o docs/balance-front-alexnet-h100.png
# plans_gpu (issue 13's GPU target: 4x less activation memory at <= 10%
# overhead on ResNet-50 and VGG-16) writes OUT_DIR/plans-gpu.csv for
# scripts/plot_plans.py. BIN_DIR holds vtrain, cuda_backend_test,
# bench_memory, bench_plans and bench_cuda_ops built with
# VTRAIN_CUDA=ON (e.g. build/ and build/tests, build/bench copied together),
# and backend_conformance_test for conformance_gpu (the backend conformance
# suite's cuda and cuda_nhwc cases: every op in every precision and layout).
# VTRAIN_PART_TIMEOUT=SECONDS stops a part that runs longer (default: none),
# so that a whole run fits a lease of the GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$1 out=$2 parts=${3:-all}
mkdir -p "$out"
. scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.txt"
export VTRAIN_BINARY=$bin/vtrain VTRAIN_SOURCE_DIR=$PWD PYTHONUNBUFFERED=1
part() {  # name, then the command
  local name=$1; shift
  [[ $parts == all || ,$parts, == *,$name,* ]] || return 0
  echo "== $name: $*"
  local start=$SECONDS dog= rc
  # Job control puts the part (a command or a function) in a process group
  # of its own, which the watchdog stops whole: children included.
  set -m
  "$@" > "$out/$name.log" 2>&1 &
  local pid=$!
  if [ "${VTRAIN_PART_TIMEOUT:-0}" != 0 ]; then
    (sleep "$VTRAIN_PART_TIMEOUT" && echo "   stopped after $VTRAIN_PART_TIMEOUT s" &&
      kill -TERM -- -"$pid") 2>/dev/null &
    dog=$!
  fi
  wait "$pid"; rc=$?
  [ -n "$dog" ] && kill -- -"$dog" 2>/dev/null
  set +m
  echo "   exit $rc, $((SECONDS - start)) s"
  tail -n 25 "$out/$name.log"
}
export VTRAIN_REQUIRE_GPU=1  # a GPU test that would skip fails instead, naming why
# The CUDA tests; where some fail, each again alone with launches blocking
# (CUDA_LAUNCH_BLOCKING=1), so that a device fault is reported by the
# kernel that made it, not by a later call, and does not take the cases
# after it down with the context (a crash: the case it ran in).
gpu_tests() {
  local log rc names
  log=$(mktemp)
  "$bin/cuda_backend_test" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    names=$(sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_/]*\.[A-Za-z0-9_/]*\).*/\1/p' "$log" | sort -u)
    [ -n "$names" ] || names=$(sed -n 's/^\[ RUN      \] //p' "$log" | tail -n 1)
    for name in $names; do
      echo "== $name again, alone, CUDA_LAUNCH_BLOCKING=1"
      CUDA_LAUNCH_BLOCKING=1 "$bin/cuda_backend_test" --gtest_filter="$name"
    done
  fi
  rm -f "$log"
  return "$rc"
}
part gpu_tests gpu_tests
# Our memory-bound kernels (relu, the bias gradient and add, tiled max
# pooling) against the cuDNN calls they replaced, on VGG-16's activations.
part cuda_ops "$bin/bench_cuda_ops" --batch 64
part conformance_gpu "$bin/backend_conformance_test" --gtest_filter='*cuda*'
part train_vs_torch python3 bench/bench_gpu_train.py --vtrain "$bin/vtrain" --runs 3 --steps 300 \
  --models lenet:64,resnet18:128 --json "$out/train_vs_torch.json"
part vdnn_vgg16_b64 "$bin/bench_memory" --backend cuda --nets vgg16 --size 224 --batch 64 \
  --steps 3 --algorithm auto --deep-size 0
part vdnn_vgg16_b128 "$bin/bench_memory" --backend cuda --nets vgg16 --size 224 --batch 128 \
  --steps 3 --algorithm auto --deep-size 224 --deep-batch 16 --deep-steps 2 --deep-algorithm algo_1
part vdnn_vgg16_b256 "$bin/bench_memory" --backend cuda --nets vgg16 --size 224 --batch 256 \
  --steps 3 --algorithm auto --deep-size 0
# Through vtrain itself: VGG-16 b64 as it is, then dyn under an 8 GiB limit.
vgg16="--set model.preset=vgg16 --set data.shape=[3,224,224] --set train.batch=64
  --set train.max_steps=6 --set train.evaluate=false --set device.backend=cuda --progress line"
dyn_limit() {
  "$bin/vtrain" configs/synthetic-lenet.yaml $vgg16 &&
    "$bin/vtrain" configs/synthetic-lenet.yaml $vgg16 --set memory.policy=dyn \
      --set device.memory_limit=8GiB
}
part dyn_limit_vgg16 dyn_limit
part wr_wd_alexnet python3 bench/bench_wd.py --vtrain "$bin/vtrain" --backend cuda \
  --models alexnet:3x224x224 --batch 128 --workspace 8MiB,64MiB --policies undivided,wr,wd \
  --steps 20 --rounds 3
# AlexNet's Pareto fronts on this GPU and the WR / WD plans at 64 MiB.
alexnet="--set model.preset=alexnet --set data.shape=[3,224,224] --set train.batch=128
  --set device.backend=cuda"
fronts() {
  "$bin/vtrain" profile configs/synthetic-lenet.yaml --db "$out/alexnet.db" $alexnet \
    --set 'profile.batches=[128]' --set profile.micro_batches=powerOfTwo --set profile.repeats=3 &&
    for p in wr wd; do
      "$bin/vtrain" balance configs/synthetic-lenet.yaml --db "$out/alexnet.db" $alexnet \
        --policy $p --workspace 64MiB --out "$out/plan-$p.yaml" --fronts "$out/fronts-$p.csv" ||
        return 1
    done
}
part alexnet_fronts fronts
# Issue 15: vtrain fp32 / tf32 / bf16 / fp16 against PyTorch fp32 / TF32 /
# AMP bf16 / AMP fp16 (channels_last), and mu-cuDNN's per-kernel speedup of
# allowing PSEUDO_HALF beside TRUE_HALF.
part precisions_vs_torch python3 bench/bench_gpu_train.py --vtrain "$bin/vtrain" --runs 3 \
  --steps 200 --models lenet:64,resnet18:128,resnet50:64,vgg16:64 \
  --precisions fp32,tf32,bf16,fp16 --json "$out/precisions_vs_torch.json"
# The same with cuDNN's graph-API engines offered beside the legacy
# algorithms (conv.cudnn_graph, the default since 2026-11-27; named here so
# the part keeps measuring them), on the models where the legacy ones
# trailed AMP.
part graph_vs_torch python3 bench/bench_gpu_train.py --vtrain "$bin/vtrain" --runs 2 \
  --steps 100 --models resnet50:64,vgg16:64 --precisions bf16,fp16 \
  --vtrain-set conv.cudnn_graph=true --json "$out/graph_vs_torch.json"
# Issue 15's open target alone: VGG-16 in bf16 and fp16 against PyTorch
# AMP, two alternating runs a side (about 2 minutes on an H200).
part vgg16_vs_amp python3 bench/bench_gpu_train.py --vtrain "$bin/vtrain" --runs 2 \
  --steps 100 --models vgg16:64 --precisions bf16,fp16 --json "$out/vgg16_vs_amp.json"
# Issue 15's open target in one part: VGG-16 (first) and ResNet-50 in bf16
# and fp16 against PyTorch AMP, and beside each vtrain run one without the
# input prefetch (data.prefetch off: each batch uploaded when its step
# starts). One run of each side (about 13 s a process on an H200: 12 runs
# and 2 checks in about 3 minutes).
part prefetch python3 bench/bench_gpu_train.py --vtrain "$bin/vtrain" --runs 1 \
  --steps 100 --models vgg16:64,resnet50:64 --precisions bf16,fp16 \
  --vtrain-baseline-set data.prefetch=off --json "$out/prefetch.json"
# A convolution's bias added by the relu after it (conv.fuse_relu, on by
# default on the GPU) against the convolution's own bias add and bias
# gradient: VGG-16 (13 such pairs) in bf16, two alternating runs a side,
# beside PyTorch AMP (about 2 minutes).
part fuse_relu python3 bench/bench_gpu_train.py --vtrain "$bin/vtrain" --runs 2 \
  --steps 100 --models vgg16:64 --precisions bf16 \
  --vtrain-baseline-set conv.fuse_relu=off --json "$out/fuse_relu.json"
# How many of cuDNN's graph engines to time (conv.graph_engines): VGG-16
# bf16's first convolutions' weight gradients took 6.1 ms with 4 (the
# default until 2026-11-28, 10 since), PyTorch's sm90 kernel 0.44 ms (2026-11-27, H200); most of those 6.1 ms
# were the bias gradient's old one-block-per-channel kernel, timed with the
# weight gradient (kernels r2 replaced it). The per-kernel
# profile with 16 (every candidate's time, fastest first, for the 224x224
# layers), then training at 4, 10 (PyTorch's cudnn.benchmark_limit) and 16
# alternating, img/s from "done:"; and at 16 with every activation channels
# last (device.layout nhwc: conv1_1's 3-channel input too, which the layout
# rule keeps NCHW; PyTorch runs it channels last).
graph_engines() {
  "$bin/vtrain" profile configs/synthetic-lenet.yaml --db "$out/graph-engines.db" \
    --set model.preset=vgg16 --set "data.shape=[3,224,224]" --set train.batch=64 \
    --set device.backend=cuda --set train.precision=bf16 --set conv.graph_engines=16 \
    --set profile.micro_batches=undivided --set "profile.batches=[64]" > /dev/null || return 1
  python3 - "$out/graph-engines.db" <<'PY' | head -60
import sqlite3, sys
rows = sqlite3.connect(sys.argv[1]).execute(
    "select k.c, k.kind, m.algorithm, m.time_ms from kernel_measurements m"
    " join kernels k on k.id = m.kernel_id where k.h = 224 order by k.c, k.kind, m.time_ms")
for r in rows: print(*r, sep="\t")
PY
  for round in 1 2; do
    for v in "4 auto" "10 auto" "16 auto" "16 nhwc"; do
      set -- $v
      echo -n "graph_engines $1, layout $2, round $round: "
      "$bin/vtrain" configs/synthetic-lenet.yaml --set model.preset=vgg16 \
        --set "data.shape=[3,224,224]" --set train.batch=64 --set train.max_steps=60 \
        --set train.evaluate=false --set device.backend=cuda --set train.precision=bf16 \
        --set conv.graph_engines=$1 --set device.layout=$2 --progress line |
        grep "^done:" || return 1
    done
  done
}
part graph_engines graph_engines
# Where a step's time goes on the models where vtrain's half precision
# trailed PyTorch AMP (scripts/trace_summary.py over vtrain's --trace):
# breakdown MODELS PRECISIONS, each a space-separated list.
breakdown() {
  for m in $1; do
    for p in $2; do
      "$bin/vtrain" configs/synthetic-lenet.yaml --set model.preset=$m --set "data.shape=[3,224,224]" \
        --set train.batch=64 --set train.max_steps=12 --set train.evaluate=false \
        --set device.backend=cuda --set train.precision=$p --progress off \
        --trace "$out/trace-$m-$p.json" > /dev/null &&
        python3 scripts/trace_summary.py "$out/trace-$m-$p.json" --skip 2 || return 1
    done
  done
}
part breakdown_gpu breakdown "resnet50 vgg16" "fp32 bf16"
# VGG-16 bf16 alone (about 30 s): issue 15's open target, after part prefetch.
part breakdown_vgg16 breakdown vgg16 bf16
part pseudo_half python3 bench/bench_pseudo_half.py --vtrain "$bin/vtrain" \
  --models resnet50:64,vgg16:64 --db "$out/pseudo_half.db"
# Accuracy parity: LeNet on Fashion-MNIST, 3 epochs, in each precision on
# the GPU (target: bf16 and fp16 within 0.5 points of fp32).
fmnist=/tmp/vtrain-deps/usr/share/datasets/fashion-mnist
parity() {
  for p in fp32 tf32 bf16 fp16; do
    "$bin/vtrain" configs/fmnist-lenet.yaml --set device.backend=cuda --set train.epochs=3 \
      --set train.precision=$p --progress line --metrics "$out/parity-$p.jsonl" \
      --set data.train_images=$fmnist/train-images-idx3-ubyte.gz \
      --set data.train_labels=$fmnist/train-labels-idx1-ubyte.gz \
      --set data.test_images=$fmnist/t10k-images-idx3-ubyte.gz \
      --set data.test_labels=$fmnist/t10k-labels-idx1-ubyte.gz | grep "^done:" |
      sed "s/^/$p: /" || return 1
  done
}
part accuracy_parity parity
# NHWC against NCHW activations in half precision (auto is NHWC there).
part layouts python3 bench/bench_layouts.py --backend cuda --vtrain "$bin/vtrain" --runs 3 \
  --steps 200 --models resnet18:128,resnet50:64 --precisions bf16,fp16 --layouts auto,nchw
# Swap and recompute on the GPU: every planner at 100..25% of none's
# activations, simulated and measured (the copies' compute share near 0 on a
# copy engine, printed in the header).
part plans_gpu "$bin/bench_plans" --backend cuda --nets vgg16,resnet50 --size 224 --batch 32 \
  --steps 3 --rounds 3 --measure --no-dqn --algorithm auto --csv "$out/plans-gpu.csv"
# The joint split with offload and recompute for real (issue 14): two ranks
# on the one GPU, rank 0 limited to 1500 MiB; even, static, and the best
# split excluding batches above the limit against the joint one.
part joint_split_gpu python3 bench/bench_hetero.py --gpu --vtrain "$bin/vtrain" \
  --config configs/synthetic-lenet.yaml --set model.preset=resnet18 --set "data.shape=[3,32,32]" \
  --set data.train_size=16384 --batch 512 --steps 30 --memory-limit 1500MiB \
  --profile-batches 64,128,192,256,320,384,448
