// The CUDA backend's memory-bound kernels (worker/device/cuda/cuda_kernels.h)
// against the cuDNN calls they replaced, on VGG-16's activations at batch N
// in bf16 NHWC: relu forward and backward, the bias gradient, the bias add,
// and 2x2 max pooling forward and backward; and the f32 NCHW -> bf16 NHWC
// reorder (the pinned upload's) against cudnnTransformTensor. Each op
// alternates ours and cuDNN's for R rounds of K calls, timed with CUDA
// events; it prints the median per call, the ratio, the bandwidth each
// reaches, and how far the two results differ (relu, pooling forward and
// the reorder: exactly equal; the bias gradient: ours sums in f32, cuDNN
// rounds to bf16; pooling backward: ties may differ).
//
//   bench_cuda_ops [--batch N] [--rounds R] [--calls K]   (defaults 64, 7, 10)
//
// Needs a GPU; exits 77 (skipped) where none is visible.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "bench/bench_timing.h"
#include "worker/device/cuda/cuda_check.h"
#include "worker/device/cuda/cuda_kernels.h"

namespace {

using vtrain::worker::cuda::Element;
namespace cuda = vtrain::worker::cuda;

#define CHECK(expr) VTRAIN_CUDA_CHECK(expr, "bench_cuda_ops")

struct Buffer {
  explicit Buffer(size_t bytes) { CHECK(cudaMalloc(&p, bytes)); }
  ~Buffer() { cudaFree(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* p = nullptr;
};

// Per-call milliseconds of `k` back-to-back calls of f on `stream`.
double time_calls(cudaStream_t stream, int k, const std::function<void()>& f) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < k; ++i) f();
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms / k;
}

// Random bf16 in [lo, hi), rounded on the GPU from host floats.
void fill_random(void* dst, int64_t count, float lo, float hi, unsigned seed, cudaStream_t s) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> host(static_cast<size_t>(count));
  for (float& v : host) v = dist(rng);
  Buffer f32(host.size() * sizeof(float));
  CHECK(cudaMemcpy(f32.p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  cuda::reorder(Element::kF32, f32.p, 1, Element::kBF16, dst, {1, count, 1, 1, 1}, s);
  CHECK(cudaStreamSynchronize(s));
}

std::vector<float> to_host(const void* src, int64_t count, Element type) {
  std::vector<float> out(static_cast<size_t>(count));
  if (type == Element::kF32) {
    CHECK(cudaMemcpy(out.data(), src, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<__nv_bfloat16> half(out.size());
  CHECK(cudaMemcpy(half.data(), src, half.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < out.size(); ++i) out[i] = __bfloat162float(half[i]);
  return out;
}

// Largest |a - b| (NaN where exactly one of them is NaN).
double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return NAN;
    if (!std::isnan(a[i])) worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])));
  }
  return worst;
}

struct Options {
  int64_t batch = 64;
  int rounds = 7;
  int calls = 10;
};

// One op: ours and cuDNN's, each once (a warm-up, after which
// `difference` compares their results), then alternating; `bytes` moved per
// call.
void compare(const char* op, const std::string& shape, double bytes, const Options& o,
             cudaStream_t s, const std::function<void()>& ours,
             const std::function<void()>& theirs, const std::function<double()>& difference) {
  ours();
  theirs();
  const double diff = difference();
  std::vector<double> a, b;
  for (int r = 0; r < o.rounds; ++r) {
    a.push_back(time_calls(s, o.calls, ours));
    b.push_back(time_calls(s, o.calls, theirs));
  }
  const double ma = vtrain::bench::median(a), mb = vtrain::bench::median(b);
  std::printf("%-16s %-18s %9.3f %9.3f %7.2fx %8.0f %8.0f %10.3g\n", op, shape.c_str(), ma, mb,
              mb / ma, bytes / ma / 1e6, bytes / mb / 1e6, diff);
}

// The largest difference of two bf16 tensors of `count` elements on the GPU.
double bf16_difference(const void* a, const void* b, int64_t count) {
  return max_difference(to_host(a, count, Element::kBF16), to_host(b, count, Element::kBF16));
}

int run(const Options& o) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda_ops: no CUDA GPU visible: skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudnnHandle_t handle;
  CHECK(cudnnCreate(&handle));
  CHECK(cudnnSetStream(handle, s));
  std::printf("bench_cuda_ops: %s, cuDNN %zu, batch %lld, bf16 NHWC, %d rounds of %d calls\n",
              prop.name, cudnnGetVersion(), static_cast<long long>(o.batch), o.rounds, o.calls);
  std::printf("%-16s %-18s %9s %9s %8s %8s %8s %10s\n", "op", "shape", "ours_ms", "cudnn_ms",
              "speedup", "ours_GB/s", "cudnn_GB/s", "max_diff");

  cudnnActivationDescriptor_t relu;
  CHECK(cudnnCreateActivationDescriptor(&relu));
  CHECK(cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  cudnnPoolingDescriptor_t pool;
  CHECK(cudnnCreatePoolingDescriptor(&pool));
  CHECK(cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_PROPAGATE_NAN, 2,
                                    2, 0, 0, 2, 2));
  // A cuDNN descriptor (bf16 NHWC unless said otherwise), destroyed with the
  // others at the end.
  std::vector<cudnnTensorDescriptor_t> descriptors;
  const auto tensor = [&](int64_t n, int64_t c, int64_t h, int64_t w,
                          cudnnTensorFormat_t format = CUDNN_TENSOR_NHWC,
                          cudnnDataType_t type = CUDNN_DATA_BFLOAT16) {
    cudnnTensorDescriptor_t d;
    CHECK(cudnnCreateTensorDescriptor(&d));
    descriptors.push_back(d);
    CHECK(cudnnSetTensor4dDescriptor(d, format, type, int(n), int(c), int(h), int(w)));
    return d;
  };
  const float one = 1.0f, zero = 0.0f;

  // The layout and type conversion the pinned upload and NHWC convolutions
  // run (f32 NCHW -> bf16 NHWC) against cudnnTransformTensor.
  for (const int64_t c : {int64_t{3}, int64_t{64}}) {
    const int64_t n = o.batch, h = c == 3 ? 224 : 112, w = h, count = n * c * h * w;
    const std::string shape = std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
    Buffer src(count * 4), ours(count * 2), theirs(count * 2);
    fill_random(ours.p, count, -1.0f, 1.0f, 4, s);  // bf16 noise, then widened to the f32 source
    cuda::reorder(Element::kBF16, ours.p, 1, Element::kF32, src.p, {1, count, 1, 1, 1}, s);
    const cudnnTensorDescriptor_t from = tensor(n, c, h, w, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT),
                                  to = tensor(n, c, h, w);
    compare(
        "reorder_to_nhwc", shape, 6.0 * count, o, s,
        [&] { cuda::reorder(Element::kF32, src.p, 1, Element::kBF16, ours.p, {n, c, h, w, c}, s); },
        [&] { CHECK(cudnnTransformTensor(handle, &one, from, src.p, &zero, to, theirs.p)); },
        [&] { return bf16_difference(ours.p, theirs.p, count); });
  }

  struct Layer {
    int64_t c, hw;
  };
  for (const Layer l : {Layer{64, 224}, Layer{128, 112}, Layer{256, 56}, Layer{512, 28}}) {
    const int64_t n = o.batch, c = l.c, h = l.hw, w = l.hw;
    const int64_t count = n * c * h * w, pooled = count / 4;
    const std::string shape = std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
    const double bytes = 2.0 * static_cast<double>(count);  // one bf16 tensor
    Buffer x(count * 2), y(count * 2), dy(count * 2), dx(count * 2), y2(count * 2), dx2(count * 2);
    Buffer bias(c * 2), db_ours(c * 4), db_cudnn(c * 2);
    Buffer partials(static_cast<size_t>(cuda::bias_gradient_partial_bytes(n, c, h * w, true)));
    fill_random(x.p, count, -1.0f, 1.0f, 1, s);
    fill_random(dy.p, count, -1.0f, 1.0f, 2, s);
    fill_random(bias.p, c, -1.0f, 1.0f, 3, s);
    const cudnnTensorDescriptor_t full = tensor(n, c, h, w), half = tensor(n, c, h / 2, w / 2),
                                  channel = tensor(1, c, 1, 1),
                                  // cuDNN's activation ran on a tensor's storage.
                                  flat = tensor(count, 1, 1, 1, CUDNN_TENSOR_NCHW);

    compare(
        "relu_forward", shape, 2 * bytes, o, s,
        [&] { cuda::relu_forward(Element::kBF16, x.p, y.p, count, s); },
        [&] { CHECK(cudnnActivationForward(handle, relu, &one, flat, x.p, &zero, flat, y2.p)); },
        [&] { return bf16_difference(y.p, y2.p, count); });

    compare(
        "relu_backward", shape, 3 * bytes, o, s,
        [&] { cuda::relu_backward(Element::kBF16, y.p, dy.p, dx.p, count, s); },
        [&] {
          CHECK(cudnnActivationBackward(handle, relu, &one, flat, y.p, flat, dy.p, flat, y.p,
                                        &zero, flat, dx2.p));
        },
        [&] { return bf16_difference(dx.p, dx2.p, count); });

    compare(
        "bias_gradient", shape, bytes, o, s,
        [&] {
          cuda::bias_gradient(Element::kBF16, dy.p, n, c, h * w, true,
                              static_cast<float*>(db_ours.p), 0.0f, partials.p, s);
        },
        [&] {
          CHECK(cudnnConvolutionBackwardBias(handle, &one, full, dy.p, &zero, channel, db_cudnn.p));
        },
        [&] {
          return max_difference(to_host(db_ours.p, c, Element::kF32),
                                to_host(db_cudnn.p, c, Element::kBF16));
        });

    // The bias add writes y in place: ours on y, cuDNN's on y2 (both from
    // x), compared after one call each.
    CHECK(cudaMemcpy(y.p, x.p, count * 2, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(y2.p, x.p, count * 2, cudaMemcpyDeviceToDevice));
    compare(
        "add_bias", shape, 2 * bytes, o, s,
        [&] { cuda::add_bias(Element::kBF16, y.p, y.p, bias.p, n, c, h * w, true, false, s); },
        [&] { CHECK(cudnnAddTensor(handle, &one, channel, bias.p, &one, full, y2.p)); },
        [&] { return bf16_difference(y.p, y2.p, count); });

    compare(
        "max_pool_forward", shape, 1.25 * bytes, o, s,
        [&] { cuda::max_pool_forward_tiled(Element::kBF16, x.p, y.p, n, c, h, w, 2, 2, true, s); },
        [&] { CHECK(cudnnPoolingForward(handle, pool, &one, full, x.p, &zero, half, y2.p)); },
        [&] { return bf16_difference(y.p, y2.p, pooled); });

    // dy of the pooled shape: the first quarter of dy. cuDNN's backward
    // reads its forward's y (y2). Random bf16 windows tie now and then,
    // where cuDNN may pick another element than the first maximum: a
    // nonzero difference here is not by itself an error of ours (the
    // tests check ours against the reference).
    compare(
        "max_pool_backward", shape, 2.25 * bytes, o, s,
        [&] {
          cuda::max_pool_backward_tiled(Element::kBF16, x.p, dy.p, dx.p, n, c, h, w, 2, 2, true, s);
        },
        [&] {
          CHECK(cudnnPoolingBackward(handle, pool, &one, half, y2.p, half, dy.p, full, x.p, &zero,
                                     full, dx2.p));
        },
        [&] { return bf16_difference(dx.p, dx2.p, count); });
  }
  for (cudnnTensorDescriptor_t d : descriptors) cudnnDestroyTensorDescriptor(d);
  cudnnDestroyPoolingDescriptor(pool);
  cudnnDestroyActivationDescriptor(relu);
  cudnnDestroy(handle);
  cudaStreamDestroy(s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  vtrain::bench::Args args(argc, argv);
  while (args.next()) {
    const std::string a = args.arg();
    if (a == "--batch" || a == "--rounds" || a == "--calls") {
      const std::string text = args.value();
      char* end = nullptr;
      const long v = std::strtol(text.c_str(), &end, 10);
      if (*end != '\0' || v <= 0) {
        std::fprintf(stderr, "bench_cuda_ops: %s takes a positive integer, got '%s'\n", a.c_str(),
                     text.c_str());
        return 2;
      }
      // cuDNN's descriptors take int sizes: VGG-16's largest activation
      // (64 x 224 x 224 a sample) must stay below 2^31 elements.
      if (a == "--batch" && v > 512) {
        std::fprintf(stderr, "bench_cuda_ops: --batch at most 512, got %ld\n", v);
        return 2;
      }
      if (a == "--batch") o.batch = v;
      if (a == "--rounds") o.rounds = static_cast<int>(v);
      if (a == "--calls") o.calls = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "usage: bench_cuda_ops [--batch N] [--rounds R] [--calls K]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", e.what());
    return 1;
  }
}
