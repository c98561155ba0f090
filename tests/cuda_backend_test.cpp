// The CUDA backend's own behaviour (ctest label gpu): the device it
// describes, memory limits, streams and events, transfers in every layout,
// micro-batched convolutions, conv errors, training on the GPU, the memory
// policies on real streams, and NCCL. Every test skips, saying why, where no
// CUDA GPU is visible, so the suite builds and runs on CI machines without
// one. What each op computes is checked on every backend, this one included,
// by backend_conformance_test.
#include "worker/comm/nccl_communicator.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "memory/device_pool.h"
#include "memory/vdnn_plan.h"
#include "tests/backend_conformance.h"
#include "tests/backend_conformance_checks.h"
#include "tests/backend_test_support.h"
#include "tests/engine_runs.h"
#include "tests/reference_ops.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/train/checkpoint.h"
#include "worker/comm/communicator.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/engine/optimizer.h"

namespace vtrain::worker {
namespace {

using namespace vtrain::backend_test;  // NOLINT: the shared test helpers

// FFT and Winograd convolutions round more (transforms in float).
constexpr double kTransformRtol = 1e-3;

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    if (const std::optional<std::string> why = cuda::cuda_unavailable()) {         \
      VTRAIN_SKIP_WITHOUT_GPU("no CUDA GPU usable (" + *why + ")");                \
    }                                                                              \
  } while (0)

// Backends shared by the tests, created on first use (never without a GPU).
Backend& gpu() {
  static const std::unique_ptr<Backend> backend =
      cuda::make_cuda_backend({.kind = worker::BackendKind::kCuda});
  return *backend;
}
Backend& cpu() {
  static const std::unique_ptr<Backend> backend =
      make_backend({.kind = worker::BackendKind::kCpu, .threads = 2});
  return *backend;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

// ================================================================ device

// The kernels' storage count (the grid-stride bound of reorder and fill)
// is the tensor's: host arithmetic, no GPU needed. It once rounded n * c up
// to the block instead of c, which for NHWC (block = c) doubled the count.
TEST(CudaKernelShapes, BlockedShapeCountsTheStorageOfEveryLayout) {
  for (int64_t n : {1, 2, 7}) {
    for (int64_t c : {1, 3, 11, 13, 64}) {
      for (Layout layout : {Layout::kPlain, Layout::kBlocked8, Layout::kBlocked16, Layout::kNhwc}) {
        const TensorDesc d{{n, c, 3, 5}, layout};
        const cuda::BlockedShape b{n, c, 3, 5, channel_block(d)};
        EXPECT_EQ(b.storage_elements(), d.storage_elements())
            << d.shape.str() << " " << layout_name(layout);
      }
    }
  }
}

TEST_F(CudaBackendTest, DescribesTheDevice) {
  const DeviceInfo info = gpu().device_info();
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.memory_bytes, size_t{1} << 28);
  EXPECT_EQ(info.library_version.rfind("cuDNN 9.", 0), 0u) << info.library_version;
  EXPECT_FALSE(info.host.empty());
  EXPECT_EQ(gpu().preferred_layout(64), Layout::kPlain);  // fp32: NCHW
  // Half precision keeps activations channels last (tensor cores' layout),
  // device.layout forces either.
  EXPECT_EQ(
      make_backend({.kind = worker::BackendKind::kCuda, .settings = {.precision = common::Precision::kFp16}})
          ->preferred_layout(64),
      Layout::kNhwc);
  EXPECT_EQ(make_backend({.kind = worker::BackendKind::kCuda, .settings = {.layout = LayoutChoice::kNhwc}})
                ->preferred_layout(3),
            Layout::kNhwc);
  EXPECT_EQ(make_backend({.kind = worker::BackendKind::kCuda,
                          .settings = {.precision = common::Precision::kBf16,
                                       .layout = LayoutChoice::kNchw}})
                ->preferred_layout(64),
            Layout::kPlain);
  EXPECT_EQ(pooling_state_bytes(gpu(), {}, desc({2, 3, 4, 4}), desc({2, 3, 2, 2})), 0u);
}

// A convolution's bias is a pass over the activations here: the fusion
// pass's rule under auto pairs it with the relu after it (prefers()), and
// nothing else is preferred.
TEST_F(CudaBackendTest, PrefersTheBiasPairedReluOnly) {
  const TensorDesc x = desc({2, 8, 4, 4});
  ActivationDesc forward;
  forward.x = forward.y = x;
  EXPECT_FALSE(gpu().prefers(forward));
  forward.bias = true;
  EXPECT_TRUE(gpu().prefers(forward));
  ActivationDesc backward;
  backward.direction = Direction::kBackward;
  backward.y = backward.dy = backward.dx = x;
  backward.bias = true;
  EXPECT_TRUE(gpu().prefers(backward));
  EXPECT_FALSE(gpu().prefers(BinaryDesc{.a = x, .b = x, .y = x}));
}

TEST_F(CudaBackendTest, FactoryPicksCudaForAutoWhenAGpuIsVisible) {
  EXPECT_TRUE(gpu_available());
  EXPECT_EQ(make_backend({.kind = worker::BackendKind::kAuto})->device_info().backend, "cuda");
  EXPECT_EQ(make_backend({.kind = worker::BackendKind::kCuda})->device_info().backend, "cuda");
}

TEST_F(CudaBackendTest, CountsDeviceMemoryAndEnforcesTheLimit) {
  const auto b =
      cuda::make_cuda_backend({.kind = worker::BackendKind::kCuda, .memory_limit = 1 << 20});
  EXPECT_EQ(b->device_info().memory_bytes, size_t{1} << 20);
  void* a = b->allocate_device(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_GE(b->device_bytes_in_use(), 1000u);
  void* c = b->allocate_device(300000);
  const size_t both = b->device_bytes_in_use();
  b->free_device(c);
  EXPECT_LT(b->device_bytes_in_use(), both);
  EXPECT_EQ(b->device_bytes_peak(), both);
  b->reset_peak();
  EXPECT_EQ(b->device_bytes_peak(), b->device_bytes_in_use());
  const std::string message =
      test_support::error_message<BackendError>([&] { b->allocate_device(2 << 20); });
  EXPECT_CONTAINS(message, "requested 2097152 bytes");
  EXPECT_CONTAINS(message, "capacity of 1048576");
  b->free_device(a);
  EXPECT_EQ(b->device_bytes_in_use(), 0u);
  int on_stack = 0;
  EXPECT_THROW(b->free_device(&on_stack), BackendError);
}

TEST_F(CudaBackendTest, CopyAsyncRoundTripOnTheMemoryStreamWithEvents) {
  Backend& b = gpu();
  const int64_t count = 1 << 20;
  const size_t bytes = count * sizeof(float);
  float* host_in = static_cast<float*>(b.allocate_pinned(bytes));
  float* host_out = static_cast<float*>(b.allocate_pinned(bytes));
  for (int64_t i = 0; i < count; ++i) host_in[i] = static_cast<float>(i % 977);
  std::memset(host_out, 0, bytes);
  DeviceBuffer device(b, bytes);

  b.copy_async(device.get(), host_in, bytes, StreamKind::kMemory);  // prefetch
  const Event copied_in = b.record_event(StreamKind::kMemory);
  b.wait_event(StreamKind::kCompute, copied_in);
  scale(b, device.floats(), count, 2.0f);  // compute uses the prefetched data
  const Event scaled = b.record_event(StreamKind::kCompute);
  b.wait_event(StreamKind::kMemory, scaled);
  b.copy_async(host_out, device.get(), bytes, StreamKind::kMemory);  // offload
  const Event copied_out = b.record_event(StreamKind::kMemory);
  b.synchronize(copied_out);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(host_out[i], 2.0f * static_cast<float>(i % 977)) << "element " << i;
  }
  // Events that have passed stay valid to wait on and synchronise with.
  b.synchronize(StreamKind::kMemory);
  b.synchronize(StreamKind::kCompute);
  b.wait_event(StreamKind::kCompute, copied_in);
  b.synchronize(copied_in);
  b.synchronize(Event{});
  EXPECT_THROW(b.synchronize(Event{StreamKind::kMemory, 1u << 30}), BackendError);
  b.free_pinned(host_in);
  b.free_pinned(host_out);
}

// A staged batch sits in pinned memory and converts on the device; other
// floats round on the host. Both give the same bits, in every type and
// layout: rounding ties, subnormals and overflow included.
TEST_F(CudaBackendTest, UploadsFromPinnedAndPageableMemoryAlike) {
  Backend& b = gpu();
  const Shape shape{3, 5, 7, 9};
  std::mt19937 rng(5);
  Vec x = random_vec(rng, shape.elements(), -4.0f, 4.0f);
  const float edges[] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 1.0f + 1.0f / 256, 1e-6f,
                         -3e-8f, 1e-40f, 70000.0f, -1e30f, 65520.0f, 0.0f, -0.0f};
  std::copy(std::begin(edges), std::end(edges), x.begin());
  float* pinned = static_cast<float*>(b.allocate_pinned(x.size() * sizeof(float)));
  std::copy(x.begin(), x.end(), pinned);
  for (DataType type : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
    for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + layout_name(layout));
      DeviceTensor from_pageable(b, desc(shape, layout, type));
      DeviceTensor from_pinned(b, desc(shape, layout, type));
      b.upload(x.data(), from_pageable.tensor);
      b.upload(pinned, from_pinned.tensor);
      const Vec a = from_device(b, from_pageable.tensor);
      const Vec c = from_device(b, from_pinned.tensor);
      const Vec want = rounded(type, x);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(want[i]))
            << "pageable element " << i << " = " << x[i];
        ASSERT_EQ(std::bit_cast<uint32_t>(c[i]), std::bit_cast<uint32_t>(want[i]))
            << "pinned element " << i << " = " << x[i];
      }
    }
  }
  b.free_pinned(pinned);
}

TEST_F(CudaBackendTest, UploadDownloadConvertAndFillInEveryLayout) {
  Backend& b = gpu();
  std::mt19937 rng(3);
  const Shape s{2, 11, 3, 5};  // channels not a multiple of any block
  const Vec host = random_vec(rng, s.elements());
  constexpr Layout kLayouts[] = {Layout::kPlain, Layout::kBlocked8, Layout::kBlocked16,
                                 Layout::kNhwc};
  for (Layout layout : kLayouts) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor t = to_device(b, host, desc(s, layout));
    EXPECT_EQ(from_device(b, t.tensor), host);
    for (Layout other : kLayouts) {
      DeviceTensor u(b, desc(s, other));
      b.convert(t.tensor, u.tensor);
      EXPECT_EQ(from_device(b, u.tensor), host) << "to " << layout_name(other);
    }
    DeviceTensor filled(b, desc(s, layout));
    b.fill(filled.tensor, kNaN);
    b.fill(filled.tensor, 2.5f);
    EXPECT_EQ(from_device(b, filled.tensor), Vec(host.size(), 2.5f));
    // Padding channels hold zeros: the whole storage sums to 2.5 * elements.
    const Vec storage = from_device(b, filled.tensor.f32("test"), filled.tensor.desc.storage_elements());
    double sum = 0;
    for (float v : storage) sum += v;
    EXPECT_DOUBLE_EQ(sum, 2.5 * static_cast<double>(s.elements()));
  }
  std::vector<int32_t> labels{3, 1, 4, 1, 5};
  DeviceBuffer device_labels(b, labels.size() * sizeof(int32_t));
  b.upload_labels(labels.data(), static_cast<int32_t*>(device_labels.get()), 5);
  std::vector<int32_t> back(5);
  b.copy_async(back.data(), device_labels.get(), 5 * sizeof(int32_t), StreamKind::kCompute);
  b.synchronize(StreamKind::kCompute);
  EXPECT_EQ(back, labels);
}

// ============================================================== convolution

TEST_F(CudaBackendTest, MicroBatchedConvolutionEqualsUndivided) {
  // Two halves: Forward and BackwardData on disjoint slices, BackwardFilter
  // with beta = 0 then 1, so dW and dbias sum over both (mu-cuDNN's bug was
  // passing the caller's beta to every micro-batch).
  ConvProblem p = backend_test::conv_problem({"mb", 8, 9, 9, 12, 3, 1, 1, 6});
  const ConvData d(p);
  Backend& b = gpu();
  const DeviceTensor x = to_device(b, d.x, p.x);
  const DeviceTensor dy = to_device(b, d.dy, p.y);
  const DeviceBuffer w = to_device(b, d.w);
  const DeviceBuffer bias = to_device(b, d.bias);
  const ConvProblem half = p.with_batch(3);
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const ConvAlgoInfo whole_algo = conv_algorithms(b, kind, p, false).front();
    const ConvAlgoInfo half_algo = conv_algorithms(b, kind, half, false).back();
    DeviceBuffer ws(b, std::max(whole_algo.workspace_bytes, half_algo.workspace_bytes));
    const size_t ws_bytes = std::max(whole_algo.workspace_bytes, half_algo.workspace_bytes);
    const std::string what =
        std::string(conv_kind_name(kind)) + " " + whole_algo.name + " vs " + half_algo.name + " x2";
    switch (kind) {
      case ConvKind::kForward: {
        DeviceTensor whole(b, p.y), parts(b, p.y);
        conv_forward(b, whole_algo.algo, p, x.tensor, w.floats(), bias.floats(), whole.tensor, 0.0f,
                       ws.get(), ws_bytes);
        for (int64_t first : {0, 3}) {
          conv_forward(b, half_algo.algo, half, x.tensor.samples(first, 3), w.floats(),
                         bias.floats(), parts.tensor.samples(first, 3), 0.0f, ws.get(), ws_bytes);
        }
        expect_close(from_device(b, parts.tensor), from_device(b, whole.tensor), kTransformRtol,
                     what);
        break;
      }
      case ConvKind::kBackwardData: {
        DeviceTensor whole(b, p.x), parts(b, p.x);
        conv_backward_data(b, whole_algo.algo, p, dy.tensor, w.floats(), whole.tensor, 0.0f,
                             ws.get(), ws_bytes);
        for (int64_t first : {0, 3}) {
          conv_backward_data(b, half_algo.algo, half, dy.tensor.samples(first, 3), w.floats(),
                               parts.tensor.samples(first, 3), 0.0f, ws.get(), ws_bytes);
        }
        expect_close(from_device(b, parts.tensor), from_device(b, whole.tensor), kTransformRtol,
                     what);
        break;
      }
      case ConvKind::kBackwardFilter: {
        const int64_t dw_count = p.weight_shape().elements();
        DeviceBuffer whole_dw(b, dw_count * sizeof(float)), parts_dw(b, dw_count * sizeof(float));
        DeviceBuffer whole_db(b, p.k * sizeof(float)), parts_db(b, p.k * sizeof(float));
        b.fill(flat(parts_dw.floats(), dw_count), kNaN);
        b.fill(flat(parts_db.floats(), p.k), kNaN);
        conv_backward_filter(b, whole_algo.algo, p, x.tensor, dy.tensor, whole_dw.floats(),
                               whole_db.floats(), 0.0f, ws.get(), ws_bytes);
        for (int64_t first : {0, 3}) {
          conv_backward_filter(b, half_algo.algo, half, x.tensor.samples(first, 3),
                                 dy.tensor.samples(first, 3), parts_dw.floats(), parts_db.floats(),
                                 first == 0 ? 0.0f : 1.0f, ws.get(), ws_bytes);
        }
        expect_close(from_device(b, parts_dw.floats(), dw_count),
                     from_device(b, whole_dw.floats(), dw_count), kTransformRtol, what + " dw");
        expect_close(from_device(b, parts_db.floats(), p.k), from_device(b, whole_db.floats(), p.k),
                     kSumRtol, what + " dbias");
        expect_close(from_device(b, whole_dw.floats(), dw_count), d.dw_ref, kTransformRtol,
                     what + " dw vs reference");
        break;
      }
    }
  }
}

TEST_F(CudaBackendTest, ConvolutionErrorsNameTheProblem) {
  Backend& b = gpu();
  const ConvProblem p = backend_test::conv_problem({"err", 4, 6, 6, 4, 3, 1, 1, 2});
  EXPECT_CONTAINS(test_support::error_message<BackendError>(
                      [&] { b.conv_algorithm_name(ConvKind::kForward, 99); }),
                  "implicit_gemm");
  const ConvAlgoInfo info = conv_algorithms(b, ConvKind::kForward, p, false).front();
  DeviceTensor x(b, p.x), y(b, p.y);
  DeviceBuffer w(b, p.weight_shape().elements() * sizeof(float));
  if (info.workspace_bytes > 0) {
    EXPECT_CONTAINS(test_support::error_message<BackendError>([&] {
                      conv_forward(b, info.algo, p, x.tensor, w.floats(), nullptr, y.tensor, 0.0f,
                                     nullptr, info.workspace_bytes - 1);
                    }),
                    "workspace");
  }
  ConvProblem blocked = p;
  blocked.x.layout = Layout::kBlocked8;
  EXPECT_CONTAINS(test_support::error_message<BackendError>(
                      [&] { conv_algorithms(b, ConvKind::kForward, blocked, false); }),
                  "nChw8c");
  EXPECT_THROW(
      conv_forward(b, info.algo, p, x.tensor, w.floats(), nullptr, y.tensor, 0.5f, nullptr, 0),
      BackendError);
}

// Under train.precision tf32 every kind of convolution also comes in TF32
// tensor-core variants ("<name>/tf32", timed and chosen like any
// algorithm); their results stay within TF32's rounding (10-bit mantissa
// inputs, f32 sums) of the reference. An fp32 backend offers none and
// refuses to run one.
TEST_F(CudaBackendTest, Tf32OffersTensorCoreVariantsWithinTf32RoundingOfTheReference) {
  const std::unique_ptr<Backend> tf32 = cuda::make_cuda_backend(
      {.kind = worker::BackendKind::kCuda, .settings = {.precision = common::Precision::kTf32}});
  if (const std::optional<std::string> why = tf32->precision_unavailable(common::Precision::kTf32)) {
    GTEST_SKIP() << *why;
  }
  const ConvProblem p = backend_test::conv_problem({"tf32", 32, 16, 16, 32, 3, 1, 1, 8});
  const ConvData d(p);
  Backend& b = *tf32;
  const DeviceTensor x = to_device(b, d.x, p.x);
  const DeviceBuffer w = to_device(b, d.w);
  const DeviceBuffer bias = to_device(b, d.bias);
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const std::vector<ConvAlgoInfo> algos = conv_algorithms(b, kind, p, false);
    const auto variants = std::count_if(algos.begin(), algos.end(), [](const ConvAlgoInfo& a) {
      return a.name.ends_with("/tf32");
    });
    EXPECT_GT(variants, 0) << conv_kind_name(kind);
    for (const ConvAlgoInfo& a : conv_algorithms(gpu(), kind, p, false)) {
      EXPECT_FALSE(a.name.ends_with("/tf32")) << a.name;
    }
  }
  int ran = 0;
  for (const ConvAlgoInfo& a : conv_algorithms(b, ConvKind::kForward, p, false)) {
    if (!a.name.ends_with("/tf32")) continue;
    DeviceTensor y(b, p.y);
    DeviceBuffer ws(b, std::max<size_t>(a.workspace_bytes, 1));
    conv_forward(b, a.algo, p, x.tensor, w.floats(), bias.floats(), y.tensor, 0.0f, ws.get(),
                   a.workspace_bytes);
    expect_close(from_device(b, y.tensor), d.y_ref, 1e-2, a.name);
    ++ran;
    DeviceTensor y32(gpu(), p.y);
    const DeviceTensor x32 = to_device(gpu(), d.x, p.x);
    const DeviceBuffer w32 = to_device(gpu(), d.w);
    EXPECT_CONTAINS(test_support::error_message<BackendError>([&] {
                      conv_forward(gpu(), a.algo, p, x32.tensor, w32.floats(), nullptr,
                                   y32.tensor, 0.0f, ws.get(), a.workspace_bytes);
                    }),
                    "TF32");
  }
  EXPECT_GT(ran, 0);
}

// ======================================================== half precision

// The precision that stores tensors in `type`, and why this GPU cannot run
// it (nothing when it can).
std::optional<std::string> half_unavailable(DataType type) {
  return gpu().precision_unavailable(type == DataType::kBF16 ? common::Precision::kBf16
                                                             : common::Precision::kFp16);
}

bool has_suffix(const ConvAlgoInfo& a, std::string_view suffix) { return a.name.ends_with(suffix); }

// Every algorithm of every kind for a `type` problem carries one of
// `suffixes`, and the forward ones run within half_conv_rtol of the
// reference (each configuration at least once); an f32 problem offers
// none of them and refuses their ids, naming the types.
void expect_half_configurations(DataType type, const std::vector<std::string_view>& suffixes) {
  Backend& b = gpu();
  const ConvCase cc{"half", 16, 12, 12, 32, 3, 1, 1, 4};
  const ConvProblem p = backend_test::conv_problem(cc, Layout::kPlain, Layout::kPlain, type);
  const ConvProblem p32 = backend_test::conv_problem(cc);
  const ConvData d(p);
  for (ConvKind kind : kConvKinds) {
    const std::vector<ConvAlgoInfo> algos = conv_algorithms(b, kind, p, false);
    ASSERT_FALSE(algos.empty()) << conv_kind_name(kind) << " " << p.str();
    for (const ConvAlgoInfo& a : algos) {
      EXPECT_TRUE(std::any_of(suffixes.begin(), suffixes.end(),
                              [&](std::string_view s) { return has_suffix(a, s); }))
          << conv_kind_name(kind) << " " << a.name;
    }
    for (const ConvAlgoInfo& a : conv_algorithms(b, kind, p32, false)) {
      for (std::string_view s : suffixes) EXPECT_FALSE(has_suffix(a, s)) << a.name;
    }
    const std::string refused = test_support::error_message<BackendError>(
        [&] { conv_workspace(b, kind, algos.front().algo, p32, false); });
    EXPECT_CONTAINS(refused, dtype_name(type));
    EXPECT_CONTAINS(refused, "f32");
  }
  std::vector<int> ran(suffixes.size(), 0);
  for (const ConvAlgoInfo& a : conv_algorithms(b, ConvKind::kForward, p, false)) {
    const std::vector<Vec> y =
        run_conv(b, ConvKind::kForward, a, p, d, 0.0f, d.reference_of(ConvKind::kForward));
    expect_close(y[0], d.y_ref, half_conv_rtol(tolerances("cuda"), a.name, p, ConvKind::kForward),
                 a.name);
    for (size_t i = 0; i < suffixes.size(); ++i) ran[i] += has_suffix(a, suffixes[i]) ? 1 : 0;
  }
  // The first configuration is required; cuDNN need not offer the others
  // on every GPU (TRUE_HALF compute is NOT_SUPPORTED on some), so their
  // absence is reported, not failed.
  EXPECT_GT(ran[0], 0) << "no forward algorithm " << suffixes[0] << " for " << p.str();
  for (size_t i = 1; i < suffixes.size(); ++i) {
    if (ran[i] == 0) std::printf("note: cuDNN offers no forward algorithm %s for %s\n",
                                 std::string(suffixes[i]).c_str(), p.str().c_str());
  }
}

// f16 convolutions come in cuDNN's f16 configurations, each as algorithms
// of their own (mu-cuDNN's): "<name>/pseudo_half" (f32 compute) and, where
// cuDNN has them on this GPU, "<name>/true_half" (f16 compute), timed and
// chosen like any.
TEST_F(CudaBackendTest, F16ConvolutionsOfferPseudoHalfAndAnyTrueHalfWithinHalfRoundingOfTheReference) {
  if (const std::optional<std::string> why = half_unavailable(DataType::kF16)) GTEST_SKIP() << *why;
  expect_half_configurations(DataType::kF16,
                             {kPseudoHalfAlgorithmSuffix, kTrueHalfAlgorithmSuffix});
}

// bf16 has one: PSEUDO_BFLOAT16, f32 compute ("<name>/pseudo_bf16").
TEST_F(CudaBackendTest, Bf16ConvolutionsOfferPseudoBf16WithinBf16RoundingOfTheReference) {
  if (const std::optional<std::string> why = half_unavailable(DataType::kBF16)) {
    GTEST_SKIP() << *why;
  }
  expect_half_configurations(DataType::kBF16, {kPseudoBf16AlgorithmSuffix});
}

// Under BackendOptions::cudnn_graph (conv.cudnn_graph) half convolutions
// also come as the engine configurations of cuDNN's graph API
// ("eng<index>[_k<knob>=<value>...]" and the variant's suffix): every kind
// offers some in NCHW and NHWC, each within half rounding of the reference
// with beta 0 and 1; a backend without the option offers none.
TEST_F(CudaBackendTest, GraphEnginesRunEveryKindInBothLayoutsWithinHalfRoundingOfTheReference) {
  const std::unique_ptr<Backend> graph =
      cuda::make_cuda_backend({.kind = worker::BackendKind::kCuda, .cudnn_graph = true});
  int types = 0;
  for (DataType type : {DataType::kBF16, DataType::kF16}) {
    if (half_unavailable(type)) continue;
    ++types;
    for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
      const ConvCase cc{"graph", 16, 12, 12, 32, 3, 1, 1, 4};
      const ConvProblem p = backend_test::conv_problem(cc, layout, layout, type);
      SCOPED_TRACE(p.str());
      const ConvData d(p);
      for (ConvKind kind : kConvKinds) {
        const int engines = check_half_conv_algorithms(
            *graph, kind, p, d, tolerances("cuda"), [&](const ConvAlgoInfo& a) {
              EXPECT_EQ(graph->conv_algorithm_name(kind, a.algo), a.name);
              return is_graph_engine(a.name);
            });
        EXPECT_GT(engines, 0) << conv_kind_name(kind) << ": no graph engine offered";
        for (const ConvAlgoInfo& a : conv_algorithms(gpu(), kind, p, false)) {
          EXPECT_FALSE(is_graph_engine(a.name)) << a.name << " without cudnn_graph";
        }
      }
    }
  }
  if (types == 0) GTEST_SKIP() << "this GPU runs neither bf16 nor f16";
}

// conv.graph_engines: how many of the heuristic's engines each variant
// offers. One gives at most one per variant; eight give more for some kind
// (cuDNN ranks more than one engine for a 3x3 convolution).
TEST_F(CudaBackendTest, GraphEnginesOfferTheConfiguredNumberPerVariant) {
  const DataType type = half_unavailable(DataType::kBF16) ? DataType::kF16 : DataType::kBF16;
  if (half_unavailable(type)) GTEST_SKIP() << "this GPU runs neither bf16 nor f16";
  const ConvProblem p = backend_test::conv_problem({"count", 16, 12, 12, 32, 3, 1, 1, 4},
                                                   Layout::kNhwc, Layout::kNhwc, type);
  // Engines offered per variant suffix ("/pseudo_bf16", ...), the most of any.
  const auto most_per_variant = [&](Backend& b, ConvKind kind) {
    std::map<std::string, int> per;
    for (const ConvAlgoInfo& a : conv_algorithms(b, kind, p, false)) {
      if (is_graph_engine(a.name)) ++per[a.name.substr(a.name.find('/'))];
    }
    int most = 0;
    for (const auto& [suffix, count] : per) most = std::max(most, count);
    return most;
  };
  const auto one = cuda::make_cuda_backend(
      {.kind = worker::BackendKind::kCuda, .cudnn_graph = true, .graph_engines = 1});
  const auto eight = cuda::make_cuda_backend(
      {.kind = worker::BackendKind::kCuda, .cudnn_graph = true, .graph_engines = 8});
  int more = 0;
  for (ConvKind kind : kConvKinds) {
    SCOPED_TRACE(conv_kind_name(kind));
    const int few = most_per_variant(*one, kind), many = most_per_variant(*eight, kind);
    EXPECT_EQ(few, 1);
    EXPECT_LE(many, 8);
    if (many > 1) ++more;
  }
  EXPECT_GT(more, 0) << "no kind offered more than one engine with graph_engines 8";
}

// cuDNN writes a half convolution's dw in the half type; the contract's dw
// is f32. The workspace holds the half dw beside cuDNN's own, and every
// micro-batch's dw is added to the f32 dw with its beta (0 for the first,
// 1 after): two halves sum to the undivided gradient, and dbias (summed
// from the half dy in f32) likewise.
TEST_F(CudaBackendTest, HalfWeightGradientStaysF32AndAccumulatesOverMicroBatches) {
  Backend& b = gpu();
  int types = 0;
  for (DataType type : {DataType::kF16, DataType::kBF16}) {
    if (half_unavailable(type)) continue;
    ++types;
    SCOPED_TRACE(dtype_name(type));
    const ConvProblem p = backend_test::conv_problem({"mb", 8, 9, 9, 12, 3, 1, 1, 6},
                                                     Layout::kPlain, Layout::kPlain, type);
    const ConvData d(p);
    const ConvProblem half = p.with_batch(3);
    const int64_t dw_count = p.weight_shape().elements();
    const DeviceTensor x = to_device(b, d.x, p.x);
    const DeviceTensor dy = to_device(b, d.dy, p.y);
    for (const ConvAlgoInfo& a : conv_algorithms(b, ConvKind::kBackwardFilter, half, true)) {
      SCOPED_TRACE(a.name);
      EXPECT_GE(a.workspace_bytes, static_cast<size_t>(dw_count) * element_bytes(type));
      DeviceBuffer ws(b, a.workspace_bytes);
      DeviceBuffer dw(b, dw_count * sizeof(float)), db(b, p.k * sizeof(float));
      b.fill(flat(dw.floats(), dw_count), kNaN);
      b.fill(flat(db.floats(), p.k), kNaN);
      for (int64_t first : {0, 3}) {
        conv_backward_filter(b, a.algo, half, x.tensor.samples(first, 3),
                               dy.tensor.samples(first, 3), dw.floats(), db.floats(),
                               first == 0 ? 0.0f : 1.0f, ws.get(), a.workspace_bytes);
      }
      // Each half's dw rounded once to the type before the f32 sum.
      const double rtol = half_conv_rtol(tolerances("cuda"), a.name, half,
                                         ConvKind::kBackwardFilter) +
                          unit_roundoff(type);
      expect_close(from_device(b, dw.floats(), dw_count), d.dw_ref, rtol, "dw of both halves");
      expect_close(from_device(b, db.floats(), p.k), d.dbias_ref, kSumRtol,
                   "dbias of both halves");
    }
  }
  if (types == 0) GTEST_SKIP() << "neither f16 nor bf16: " << *half_unavailable(DataType::kF16);
}

// ============================================== our memory-bound kernels

// The per-channel sums' two passes (channel_sum_grid.h) where the tensor is
// large enough for hundreds of chunks in NHWC and tens in NCHW, against
// double sums on the host: a convolution's bias gradient, the synchronised
// batch norm's sums of the same tensor, and an inner product's bias
// gradient over 5000 rows. The data is positive, so a missed or
// twice-counted element moves a sum by more than the tolerance.
TEST_F(CudaBackendTest, ChannelSumsOverManyChunksMatchTheHost) {
  Backend& b = gpu();
  std::mt19937 rng(11);
  for (DataType type : {DataType::kBF16, DataType::kF16, DataType::kF32}) {
    if (type != DataType::kF32 && half_unavailable(type)) continue;
    for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
      // f32 NCHW sums in cuDNN's bias gradient, not ours.
      if (type == DataType::kF32 && layout == Layout::kPlain) continue;
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + layout_name(layout));
      const ConvProblem p = backend_test::conv_problem({"bias", 8, 56, 56, 40, 1, 0, 1, 16},
                                                       layout, layout, type);
      ConvData d(p);
      d.dy = rounded(type, random_vec(rng, p.y.shape.elements(), 0.5f, 1.0f));
      const Shape& ys = p.y.shape;
      const int64_t hw = ys.h * ys.w;
      // Per channel: the sum (the bias gradient's) and the sum of squares.
      std::vector<double> want(static_cast<size_t>(ys.c), 0.0), squares(want.size(), 0.0);
      for (int64_t n = 0; n < ys.n; ++n) {
        for (int64_t c = 0; c < ys.c; ++c) {
          for (int64_t i = 0; i < hw; ++i) {
            const double v = d.dy[static_cast<size_t>((n * ys.c + c) * hw + i)];
            want[c] += v;
            squares[c] += v * v;
          }
        }
      }
      const ConvAlgoInfo a = conv_algorithms(b, ConvKind::kBackwardFilter, p, true).front();
      const Vec dw_before(static_cast<size_t>(p.weight_shape().elements()), 0.0f);
      const Vec db_before(static_cast<size_t>(p.k), 3.0f);
      for (float beta : {0.0f, 1.0f}) {
        const std::vector<Vec> out =
            run_conv(b, ConvKind::kBackwardFilter, a, p, d, beta, {dw_before, db_before});
        for (int64_t c = 0; c < ys.c; ++c) {
          const double expected = want[c] + (beta == 0.0f ? 0.0 : 3.0);
          EXPECT_NEAR(out[1][static_cast<size_t>(c)], expected, 1e-6 * expected + 1e-3)
              << "channel " << c << ", beta " << beta;
        }
      }
      // The synchronised batch norm's sums of x and x^2 over the same tensor.
      const DeviceTensor dyt = to_device(b, d.dy, p.y);
      const std::vector<double> sums = batch_norm_sums(b, dyt.tensor);
      ASSERT_EQ(sums.size(), static_cast<size_t>(2 * ys.c));
      for (int64_t c = 0; c < ys.c; ++c) {
        EXPECT_NEAR(sums[c], want[c], 1e-9 * want[c]) << "sum, channel " << c;
        EXPECT_NEAR(sums[ys.c + c], squares[c], 1e-9 * squares[c]) << "sum of squares, channel " << c;
      }
    }
    // An inner product's dy {5000, 10}: 79 chunks of 64 rows.
    SCOPED_TRACE(std::string("inner product ") + dtype_name(type));
    const Shape xs{5000, 6, 1, 1}, ys{5000, 10, 1, 1};
    const Vec x = rounded(type, random_vec(rng, xs.elements()));
    const Vec dy = rounded(type, random_vec(rng, ys.elements(), 0.5f, 1.0f));
    const DeviceTensor xt = to_device(b, x, desc(xs, Layout::kPlain, type));
    const DeviceTensor dyt = to_device(b, dy, desc(ys, Layout::kPlain, type));
    DeviceBuffer dw(b, 60 * sizeof(float)), db(b, 10 * sizeof(float));
    inner_product_backward_weights(b, xt.tensor, dyt.tensor, dw.floats(), db.floats(), 0.0f);
    const Vec got = from_device(b, db.floats(), 10);
    // f32 sums in cuDNN's bias gradient, in float in an order of its own:
    // 1.8e-6 of the sum off on an H200 (one missed element moves it 1.3e-4).
    const double rtol = type == DataType::kF32 ? 1e-5 : 1e-6;
    for (int64_t o = 0; o < 10; ++o) {
      double expected = 0;
      for (int64_t n = 0; n < 5000; ++n) expected += dy[static_cast<size_t>(n * 10 + o)];
      EXPECT_NEAR(got[static_cast<size_t>(o)], expected, rtol * expected + 1e-3) << "output " << o;
    }
  }
}

// relu in our kernel, packed (16-byte accesses) and not: NaN propagates
// (as a NaN: nvcc compiles the select to max.NaN, whose NaN is the
// canonical 0x7fffffff, not the input's payload), -0 and negatives become
// +0, the rest passes bit for bit; backward passes dy where y is positive
// or NaN.
TEST_F(CudaBackendTest, ReluPropagatesNaNAndZeroesTheRestBitForBit) {
  Backend& b = gpu();
  std::mt19937 rng(12);
  const float specials[] = {kNaN, -0.0f, 0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 1e-40f, -1e-40f, 2.5f, -2.5f};
  for (const Shape shape : {Shape{2, 16, 8, 8}, Shape{1, 3, 5, 7}}) {
    for (DataType type : {DataType::kF32, DataType::kBF16, DataType::kF16}) {
      if (type != DataType::kF32 && half_unavailable(type)) continue;
      for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
        SCOPED_TRACE(shape.str() + " " + dtype_name(type) + " " + layout_name(layout));
        Vec x = random_vec(rng, shape.elements(), -2.0f, 2.0f);
        std::copy(std::begin(specials), std::end(specials), x.begin());
        x = rounded(type, x);
        const Vec dy = rounded(type, random_vec(rng, shape.elements(), -2.0f, 2.0f));
        const DeviceTensor xt = to_device(b, x, desc(shape, layout, type));
        const DeviceTensor dyt = to_device(b, dy, desc(shape, layout, type));
        DeviceTensor yt(b, desc(shape, layout, type)), dxt(b, desc(shape, layout, type));
        relu_forward(b, xt.tensor, yt.tensor);
        relu_backward(b, yt.tensor, dyt.tensor, dxt.tensor);
        const Vec y = from_device(b, yt.tensor), dx = from_device(b, dxt.tensor);
        for (size_t i = 0; i < x.size(); ++i) {
          const float want_y = x[i] <= 0.0f ? 0.0f : x[i];  // NaN <= 0 is false
          const float want_dx = x[i] <= 0.0f ? 0.0f : dy[i];
          if (std::isnan(x[i])) {
            ASSERT_TRUE(std::isnan(y[i])) << "element " << i << " = " << x[i] << ": " << y[i];
          } else {
            ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want_y))
                << "element " << i << " = " << x[i];
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(dx[i]), std::bit_cast<uint32_t>(want_dx))
              << "element " << i << " = " << x[i];
        }
      }
    }
  }
}

// Max pooling over tiling windows (2x2 and 3x3) in our kernels, packed
// (NHWC, channels a multiple of 8) and not, bit for bit against the
// reference; then a NaN in a window: forward gives NaN, backward sends that
// window's dy to it.
TEST_F(CudaBackendTest, TiledMaxPoolingMatchesTheReferenceAndPropagatesNaN) {
  Backend& b = gpu();
  std::mt19937 rng(13);
  // 2x2 stride 2 (VGG's), and 3x3 stride 3.
  const PoolDesc two{};
  PoolDesc three;
  three.window = {3, 3, 3, 3, 0, 0};
  struct PoolCase {
    Shape shape;
    PoolDesc pool;
  };
  for (const PoolCase& pc : {PoolCase{{4, 16, 32, 32}, two}, PoolCase{{2, 3, 6, 10}, two},
                             PoolCase{{2, 16, 9, 12}, three}}) {
    const Shape& shape = pc.shape;
    const PoolDesc& pool = pc.pool;
    const Window& win = pool.window;
    for (DataType type : {DataType::kF32, DataType::kBF16}) {
      if (type != DataType::kF32 && half_unavailable(type)) continue;
      for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
        SCOPED_TRACE(shape.str() + " " + std::to_string(win.kernel_h) + "x" +
                     std::to_string(win.kernel_w) + " " + dtype_name(type) + " " +
                     layout_name(layout));
        const Shape out{shape.n, shape.c, shape.h / win.kernel_h, shape.w / win.kernel_w};
        // Few distinct values: many ties, which go to the first maximum.
        Vec x = random_vec(rng, shape.elements(), -2.0f, 2.0f);
        for (float& v : x) v = std::round(v * 2.0f) / 2.0f;
        const Vec dy = rounded(type, random_vec(rng, out.elements(), -2.0f, 2.0f));
        const Vec y_ref = reference::pooling_forward(pool, shape, x);
        const Vec dx_ref = reference::pooling_backward(pool, shape, x, dy);
        const DeviceTensor xt = to_device(b, x, desc(shape, layout, type));
        const DeviceTensor dyt = to_device(b, dy, desc(out, layout, type));
        DeviceTensor yt(b, desc(out, layout, type)), dxt(b, desc(shape, layout, type));
        pooling_forward(b, pool, xt.tensor, yt.tensor, nullptr);
        pooling_backward(b, pool, xt.tensor, yt.tensor, dyt.tensor, dxt.tensor, nullptr);
        expect_equal(from_device(b, yt.tensor), y_ref, "y");
        expect_equal(from_device(b, dxt.tensor), dx_ref, "dx");

        // Element (0, 0, 1, 1) is in window (0, 0, 0, 0), not its first.
        x[static_cast<size_t>(shape.w + 1)] = kNaN;
        const DeviceTensor nan_x = to_device(b, x, desc(shape, layout, type));
        pooling_forward(b, pool, nan_x.tensor, yt.tensor, nullptr);
        pooling_backward(b, pool, nan_x.tensor, yt.tensor, dyt.tensor, dxt.tensor, nullptr);
        EXPECT_TRUE(std::isnan(from_device(b, yt.tensor)[0]));
        const Vec dx = from_device(b, dxt.tensor);
        EXPECT_EQ(dx[static_cast<size_t>(shape.w + 1)], dy[0]);
        EXPECT_EQ(dx[0], 0.0f);
      }
    }
  }
}

// ============================================================== training

// Images whose class sets the mean of one quadrant: learnable in a few steps.
void synthetic_batch(Backend& b, Network& net, int64_t n, std::mt19937& rng) {
  const Tensor in = net.input(n);
  const Shape s = in.shape();
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> x(static_cast<size_t>(s.elements()));
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t label = static_cast<int32_t>(rng() % 10);
    labels[i] = label;
    for (int64_t h = 0; h < s.h; ++h) {
      for (int64_t w = 0; w < s.w; ++w) {
        const bool marked = (h * 5 / s.h) == label / 2 && (w * 2 / s.w) == label % 2;
        x[(i * s.h + h) * s.w + w] = (marked ? 1.5f : 0.0f) + noise(rng);
      }
    }
  }
  b.upload(x.data(), in);
  b.upload_labels(labels.data(), net.labels(), n);
}

// The mean loss of the first and of the last 5 of 60 SGD steps (lr 0.02,
// momentum 0.9) of `net` from seed 1 on synthetic batches of n; every
// step's loss must be finite (a fatal failure otherwise).
struct LossWindow {
  double first = 0, last = 0;
};
LossWindow train_lenet(Backend& b, Network& net, int64_t n) {
  net.init_parameters(1);
  Sgd sgd(b, net.parameter_count(), 0.9f, 1e-4f);
  std::mt19937 rng(3);
  LossWindow w;
  for (int step = 0; step < 60; ++step) {
    synthetic_batch(b, net, n, rng);
    const LossStats s = net.train_step(n, 1.0f / static_cast<float>(n));
    sgd.step(net.parameters(), net.gradients(), 0.02f);
    const double loss = s.loss_sum / n;
    [&] { ASSERT_TRUE(std::isfinite(loss)) << "step " << step; }();
    if (::testing::Test::HasFatalFailure()) return w;
    if (step < 5) w.first += loss / 5;
    if (step >= 55) w.last += loss / 5;
  }
  return w;
}

TEST_F(CudaBackendTest, LeNetLossFallsAndStartsWhereTheCpuStarts) {
  const Graph graph = Graph::build(preset_layers("lenet", {.input = {1, 1, 28, 28}, .classes = 10}),
                                   {1, 1, 28, 28});
  const int64_t n = 32;
  NetworkOptions options;
  options.max_batch = n;
  options.conv_algorithm = "auto";
  // Same weights and batch on both backends: the same initial loss.
  double initial[2] = {0, 0};
  int which = 0;
  for (Backend* b : {&gpu(), &cpu()}) {
    Network net(graph, *b, options);
    net.init_parameters(1);
    std::mt19937 rng(2);
    synthetic_batch(*b, net, n, rng);
    initial[which++] = net.evaluate(n).loss_sum;
  }
  EXPECT_NEAR(initial[0], initial[1], 1e-4 * std::fabs(initial[1]));

  Backend& b = gpu();
  Network net(graph, b, options);
  const LossWindow loss = train_lenet(b, net, n);
  if (HasFatalFailure()) return;
  const double first = loss.first, last = loss.last;
  EXPECT_LT(last, 0.6 * first) << "mean loss of the first 5 steps " << first << ", last 5 " << last;
  EXPECT_FALSE(net.algorithm_summary().empty());
}

// A half network trains on the GPU: LeNet's loss falls in each half
// precision this GPU runs (fp16 without loss scaling: LeNet's gradients
// stay within f16's range).
TEST_F(CudaBackendTest, LeNetLossFallsInHalfPrecision) {
  int ran = 0;
  for (const common::Precision precision : {common::Precision::kFp16, common::Precision::kBf16}) {
    if (gpu().precision_unavailable(precision)) continue;
    SCOPED_TRACE(common::precision_name(precision));
    ++ran;
    const Graph graph =
        Graph::build(preset_layers("lenet", {.input = {1, 1, 28, 28}, .classes = 10}),
                     {1, 1, 28, 28});
    const int64_t n = 32;
    NetworkOptions options;
    options.settings.precision = precision;
    options.max_batch = n;
    options.conv_algorithm = "auto";
    // A backend of the job's precision, as vtrain makes: its layout rule
    // keeps LeNet's 20- and 50-channel activations NCHW (not in groups of
    // 8), the default path; and channels last (NHWC) forced.
    for (const LayoutChoice layout : {LayoutChoice::kAuto, LayoutChoice::kNhwc}) {
      SCOPED_TRACE(layout == LayoutChoice::kAuto ? "layout auto" : "layout nhwc");
      const std::unique_ptr<Backend> own = cuda::make_cuda_backend(
          {.kind = worker::BackendKind::kCuda, .settings = {.precision = precision, .layout = layout}});
      Backend& b = *own;
      Network net(graph, b, options);
      const LossWindow loss = train_lenet(b, net, n);
      if (HasFatalFailure()) return;
      const double first = loss.first, last = loss.last;
      EXPECT_LT(last, 0.6 * first) << "mean loss of the first 5 steps " << first << ", last 5 "
                                   << last;
    }
  }
  if (ran == 0) {
    GTEST_SKIP() << *gpu().precision_unavailable(common::Precision::kFp16);
  }
}

// The input prefetch on the real memory stream: cudaMemcpyAsync from
// pinned memory into the staging, ordered by events
// (test_support::check_input_prefetch), in every precision this GPU runs.
TEST_F(CudaBackendTest, PrefetchedInputIsTheBatchUploaded) {
  for (const common::Precision precision :
       {common::Precision::kFp32, common::Precision::kBf16, common::Precision::kFp16}) {
    if (gpu().precision_unavailable(precision)) continue;
    SCOPED_TRACE(common::precision_name(precision));
    const std::unique_ptr<Backend> own =
        cuda::make_cuda_backend({.kind = worker::BackendKind::kCuda, .settings = {.precision = precision}});
    test_support::check_input_prefetch(*own, precision);
  }
}

// ============================================================ memory part

// Offloads and prefetches on the real memory stream (cudaMemcpyAsync on a
// stream of its own, ordered by events), layer-wise release with freed
// blocks poisoned, and the static planner never change the numbers: every
// policy trains to the weights of the network-wide baseline, bit for bit.
// Deterministic algorithms throughout (algo_1 for both backward kinds; the
// forward algorithms are deterministic), so only the memory schedule differs.
TEST_F(CudaBackendTest, MemoryPoliciesOnRealStreamsTrainToTheWeightsOfNone) {
  using memory::Planner;
  using memory::Policy;
  using test_support::bitwise_equal;
  const std::pair<const char*, int64_t> nets[] = {{"vgg-small", 16}, {"resnet18", 8}};
  for (const auto& [preset, side] : nets) {
    SCOPED_TRACE(preset);
    const Graph g = test_support::preset_graph(preset, side);
    auto options = [](Policy policy, Planner planner, size_t capacity = 0) {
      NetworkOptions o;
      o.max_batch = 4;
      o.conv_algorithm = "algo_1";
      o.memory_policy = policy;
      o.memory_planner = planner;
      o.memory_capacity = capacity;
      o.poison_freed = policy != Policy::kNone;
      return o;
    };
    const auto base = test_support::train_steps(gpu(), g, options(Policy::kNone, Planner::kPool));
    for (float v : base.params) ASSERT_TRUE(std::isfinite(v));
    const auto all = test_support::train_steps(gpu(), g, options(Policy::kAll, Planner::kPool));
    EXPECT_TRUE(bitwise_equal(base.params, all.params)) << "all";
    EXPECT_TRUE(bitwise_equal(base.buffers, all.buffers)) << "all";
    EXPECT_GT(all.stats.offloaded_bytes, 0u);
    EXPECT_LT(all.stats.step_peak, base.stats.step_peak);
    const auto conv = test_support::train_steps(gpu(), g, options(Policy::kConv, Planner::kStatic));
    EXPECT_TRUE(bitwise_equal(base.params, conv.params)) << "conv, static";
    EXPECT_TRUE(conv.stats.static_plan.active);
    const auto dyn = test_support::train_steps(
        gpu(), g, options(Policy::kDyn, Planner::kPool, all.stats.reservation + 4096));
    EXPECT_TRUE(bitwise_equal(base.params, dyn.params)) << dyn.stats.policy;
    EXPECT_NE(dyn.stats.offload, "none") << dyn.stats.policy;
  }
}

// conv.fuse_relu's two ops against the convolution's own bias, bit for bit
// where that ran our kernels (all but f32 NCHW, cuDNN's): forward, the
// convolution with its bias then relu_forward against the convolution
// without one then bias_relu_forward; backward, relu_backward then the
// weight gradient's bias sum against relu_backward_bias. 64 channels: two
// groups of the sums' 32 channel lanes.
TEST_F(CudaBackendTest, BiasReluOpsMatchTheConvolutionsOwnBitForBit) {
  Backend& b = gpu();
  std::mt19937 rng(21);
  for (DataType type : {DataType::kBF16, DataType::kF16, DataType::kF32}) {
    if (type != DataType::kF32 && half_unavailable(type)) continue;
    for (Layout layout : {Layout::kPlain, Layout::kNhwc}) {
      if (type == DataType::kF32 && layout == Layout::kPlain) continue;
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + layout_name(layout));
      const ConvProblem p =
          backend_test::conv_problem({"pair", 8, 14, 14, 64, 1, 0, 1, 4}, layout, layout, type);
      const ConvData d(p);
      const ConvAlgoInfo fwd = conv_algorithms(b, ConvKind::kForward, p, false).front();
      const ConvAlgoInfo bwd = conv_algorithms(b, ConvKind::kBackwardFilter, p, false).front();
      DeviceBuffer ws(b, std::max(fwd.workspace_bytes, bwd.workspace_bytes));
      const DeviceTensor x = to_device(b, d.x, p.x);
      const DeviceBuffer w = to_device(b, d.w, type);
      const DeviceBuffer bias = to_device(b, d.bias, type);
      DeviceTensor y(b, p.y), unpaired(b, p.y), paired(b, p.y);
      conv_forward(b, fwd.algo, p, x.tensor, w.get(), bias.get(), y.tensor, 0.0f, ws.get(),
                     fwd.workspace_bytes);
      relu_forward(b, y.tensor, unpaired.tensor);
      conv_forward(b, fwd.algo, p, x.tensor, w.get(), nullptr, y.tensor, 0.0f, ws.get(),
                     fwd.workspace_bytes);
      bias_relu_forward(b, y.tensor, bias.get(), paired.tensor);
      const Vec relu_out = from_device(b, unpaired.tensor);
      EXPECT_TRUE(test_support::bitwise_equal(relu_out, from_device(b, paired.tensor)));
      EXPECT_GT(std::count(relu_out.begin(), relu_out.end(), 0.0f), 0);  // relu had work

      const DeviceTensor dy = to_device(b, rounded(type, random_vec(rng, p.y.shape.elements())),
                                        p.y);
      DeviceTensor dx_unpaired(b, p.y), dx_paired(b, p.y);
      DeviceBuffer dw(b, p.weight_shape().elements() * sizeof(float));
      DeviceBuffer db_unpaired(b, p.k * sizeof(float)), db_paired(b, p.k * sizeof(float));
      relu_backward(b, unpaired.tensor, dy.tensor, dx_unpaired.tensor);
      conv_backward_filter(b, bwd.algo, p, x.tensor, dx_unpaired.tensor, dw.floats(),
                             db_unpaired.floats(), 0.0f, ws.get(), bwd.workspace_bytes);
      relu_backward_bias(b, unpaired.tensor, dy.tensor, dx_paired.tensor, db_paired.floats());
      EXPECT_TRUE(test_support::bitwise_equal(from_device(b, dx_unpaired.tensor),
                                              from_device(b, dx_paired.tensor)));
      EXPECT_TRUE(test_support::bitwise_equal(from_device(b, db_unpaired.floats(), p.k),
                                              from_device(b, db_paired.floats(), p.k)));
    }
  }
}

// The same in training: the pairs (on by default on the GPU) against the
// convolutions' own bias, vgg-small's weights after 3 steps within float
// rounding (the algorithm auto picks, or cuDNN's NCHW bias ops, may add up
// in another order).
TEST_F(CudaBackendTest, BiasPairedWithReluTrainsLikeTheConvolutionsOwn) {
  Graph g = test_support::preset_graph("vgg-small", 16);
  for (const LayoutChoice layout : {LayoutChoice::kNhwc, LayoutChoice::kAuto}) {
    SCOPED_TRACE(layout == LayoutChoice::kNhwc ? "nhwc" : "nchw");
    const std::unique_ptr<Backend> b =
        cuda::make_cuda_backend({.kind = worker::BackendKind::kCuda, .settings = {.layout = layout}});
    std::vector<float> params[2];
    using enum common::AutoOnOff;
    for (const common::AutoOnOff fuse : {kOff, kAuto}) {
      NetworkOptions o;
      o.settings = {.layout = layout, .fuse_relu = fuse};
      o.max_batch = 4;
      o.conv_algorithm = "algo_1";
      EXPECT_EQ(Network(g, *b, o).bias_relu_pairs() > 0, fuse == kAuto);
      params[fuse == kAuto] = test_support::train_steps(*b, g, o, 3).params;
    }
    ASSERT_FALSE(params[0].empty());
    for (float v : params[1]) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(test_support::relative_difference(params[0], params[1]), 1e-5);
  }
}

// ================================================================== NCCL

// One MPI runtime for the process (a singleton without mpirun).
MpiRuntime& mpi_runtime() {
  static MpiRuntime runtime(nullptr, nullptr);
  return runtime;
}

// The NCCL communicator's set-up on one rank: the unique id travels, every
// element type is accepted, and wait() returns the sum, which on one rank is
// the buffer itself. NCCL queues no work for one rank (an in-place
// allreduce is a no-op there, NCCL 2.28's ncclLaunchOneRank), so the
// ordering after the compute stream and the half sums are the two-GPU
// test's to check.
TEST_F(CudaBackendTest, NcclAllreduceIsOrderedAfterComputeOnOneRank) {
  mpi_runtime();
  Backend& b = gpu();
  const std::unique_ptr<Communicator> comm = cuda::make_nccl_communicator(b);
  ASSERT_EQ(comm->size(), 1);
  const int64_t count = 1 << 20;
  DeviceBuffer buffer(b, count * sizeof(float));
  for (float value : {1.5f, -2.0f}) {
    b.fill(flat(buffer.floats(), count), value);  // queued on the compute stream
    comm->allreduce_async(buffer.floats(), count / 2);
    comm->allreduce_async(buffer.floats() + count / 2, count / 2);
    comm->wait();
    const Vec host = from_device(b, buffer.floats(), count);
    EXPECT_EQ(std::count(host.begin(), host.end(), value), count) << value;
  }
  // The half types' buckets (train.gradient_allreduce: half) as NCCL's
  // ncclFloat16 / ncclBfloat16: accepted, ordered, and (one rank) unchanged.
  for (const DataType type : {DataType::kF16, DataType::kBF16}) {
    SCOPED_TRACE(dtype_name(type));
    const Tensor half{vector_desc(count, type), buffer.get()};
    for (float value : {1.5f, -2.0f}) {
      b.fill(half, value);
      comm->allreduce_async(half.data, count, type);
      comm->wait();
      Vec host(static_cast<size_t>(count));
      b.download(half, host.data());
      EXPECT_EQ(std::count(host.begin(), host.end(), value), count) << value;
    }
  }
  // Event pairs around no work may measure 0.
  EXPECT_GE(comm->allreduce_seconds(), 0.0);
}

// Uneven per-rank batches summed by NCCL give the full-batch gradient: 20
// steps of vtrain on 2 GPUs with a 40/8 split end with the weights of one
// GPU with the whole batch of 48. Then bf16 on the 2 GPUs with the
// gradients summed in bf16 (train.gradient_allreduce: half, NCCL's
// ncclBfloat16) against the f32 sum: closer than bf16 training stays to
// fp32 training (the yardstick of Mpi.HalfGradientAllreduceFollowsFp32UnderBf16),
// and not identical. Needs one GPU per rank.
TEST_F(CudaBackendTest, NcclUnevenSplitOnTwoGpusMatchesOneGpu) {
  const int gpus = cuda::cuda_device_count();
  if (gpus < 2) GTEST_SKIP() << "NCCL needs one GPU per rank; " << gpus << " visible";
  test_support::TempDir dir;
  auto command = [&](const std::string& launch, const std::string& ckpt,
                     const std::string& extra) {
    return launch + test_support::vtrain_binary() + " " + test_support::source_dir() +
           "/configs/synthetic-lenet.yaml --progress off --set device.backend=cuda"
           " --set train.batch=48 --set train.max_steps=20"
           " --set checkpoint.dir=" + dir.path(ckpt) + " " + extra;
  };
  const std::string two_gpus = "env -u VTRAIN_STAGE_GRADIENTS " + test_support::mpirun(2);
  const std::string uneven = "--set balance.split=manual --set 'balance.manual=[40,8]' ";
  auto weights = [&](const std::string& ckpt) {
    return load_checkpoint(*latest_checkpoint(dir.path(ckpt))).parameters;
  };
  auto train = [&](const std::string& launch, const std::string& ckpt, const std::string& extra) {
    std::string out;
    EXPECT_EQ(test_support::run_command(command(launch, ckpt, extra), &out), 0) << out;
    if (!launch.empty()) {
      EXPECT_NE(out.find("gradients: summed by NCCL"), std::string::npos) << out;
    }
  };
  train("", "one", "--set conv.algorithm=algo_1");
  train(two_gpus, "two", uneven + "--set conv.algorithm=algo_1");
  if (HasFailure()) return;
  const test_support::Difference even = test_support::compare(weights("one"), weights("two"));
  EXPECT_LE(even.relative, 1e-5) << "max |diff| " << even.max_abs;

  const std::string bf16 = "--set train.precision=bf16 ";
  train(two_gpus, "fp32-2", "");
  train(two_gpus, "bf16-2", bf16);
  train(two_gpus, "half-2", bf16 + "--set train.gradient_allreduce=half");
  if (HasFailure()) return;
  const std::vector<float> bf16_weights = weights("bf16-2");
  const test_support::Difference yardstick =
      test_support::compare(weights("fp32-2"), bf16_weights);
  const test_support::Difference half = test_support::compare(bf16_weights, weights("half-2"));
  std::printf("bf16, 2 GPUs, 20 steps: bf16 vs f32 gradient sums relative diff %.3g; bf16 vs "
              "fp32 training %.3g\n",
              half.relative, yardstick.relative);
  EXPECT_GT(half.max_abs, 0.0);
  EXPECT_LT(half.relative, yardstick.relative);
}

}  // namespace
}  // namespace vtrain::worker
