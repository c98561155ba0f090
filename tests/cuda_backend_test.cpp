// The CUDA backend against the reference ops and the CPU backend, through
// the Backend interface only (ctest label gpu). Every test skips, saying why,
// where no CUDA GPU is visible, so the suite builds and runs on CI machines
// without one.
//
// Outputs written with beta = 0 are first filled with NaN: memory from the
// pool holds whatever the previous user left, so beta = 0 must not read it.
#include "worker/comm/nccl_communicator.h"
#include "worker/device/cuda/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "memory/device_pool.h"
#include "memory/vdnn_plan.h"
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

using reference::Vec;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Float sums of up to a few thousand terms against a double reference.
constexpr double kSumRtol = 1e-4;
// FFT and Winograd convolutions round more (transforms in float).
constexpr double kTransformRtol = 1e-3;
// Winograd on filters larger than 3x3 (cuDNN's nonfused F(2x2, 5x5) on the
// H100: up to 2.4e-3 of the output's scale off the double reference).
constexpr double kLargeWinogradRtol = 5e-3;

#define SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                      \
    if (!cuda::cuda_device_visible()) {                                                     \
      GTEST_SKIP() << "no CUDA GPU visible (cudaGetDeviceCount found no driver or device)"; \
    }                                                                                       \
  } while (0)

// Backends shared by the tests, created on first use (never without a GPU).
Backend& gpu() {
  static const std::unique_ptr<Backend> backend = cuda::make_cuda_backend({.kind = "cuda"});
  return *backend;
}
Backend& cpu() {
  static const std::unique_ptr<Backend> backend = make_backend({.kind = "cpu", .threads = 2});
  return *backend;
}

// ------------------------------------------------------------ memory helpers

class DeviceBuffer {
 public:
  DeviceBuffer(Backend& backend, size_t bytes)
      : backend_(&backend), ptr_(bytes == 0 ? nullptr : backend.allocate_device(bytes)) {}
  ~DeviceBuffer() {
    if (ptr_ != nullptr) backend_->free_device(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : backend_(other.backend_), ptr_(std::exchange(other.ptr_, nullptr)) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;

  void* get() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  Backend* backend_;
  void* ptr_;
};

struct DeviceTensor {
  DeviceTensor(Backend& backend, const TensorDesc& desc)
      : memory(backend, desc.bytes()), tensor{desc, memory.floats()} {}
  DeviceBuffer memory;
  Tensor tensor;
};

TensorDesc desc(Shape shape, Layout layout = Layout::kPlain) {
  return TensorDesc{.shape = shape, .layout = layout};
}

Tensor flat(float* data, int64_t count) { return Tensor{desc({1, count, 1, 1}), data}; }

DeviceTensor to_device(Backend& b, const Vec& host, const TensorDesc& d) {
  EXPECT_EQ(static_cast<int64_t>(host.size()), d.shape.elements());
  DeviceTensor t(b, d);
  b.upload(host.data(), t.tensor);
  return t;
}

DeviceBuffer to_device(Backend& b, const Vec& host) {
  DeviceBuffer buffer(b, host.size() * sizeof(float));
  if (!host.empty())
    b.upload(host.data(), flat(buffer.floats(), static_cast<int64_t>(host.size())));
  return buffer;
}

Vec from_device(Backend& b, const Tensor& t) {
  Vec host(static_cast<size_t>(t.shape().elements()));
  b.download(t, host.data());
  return host;
}

Vec from_device(Backend& b, const float* data, int64_t count) {
  Vec host(static_cast<size_t>(count));
  b.download(flat(const_cast<float*>(data), count), host.data());
  return host;
}

Vec random_vec(std::mt19937& rng, int64_t count, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

Vec plus(const Vec& a, const Vec& b) { return reference::add(a, b); }

// Elementwise |actual - expected| <= rtol * (|expected| + largest |expected|).
void expect_close(const Vec& actual, const Vec& expected, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double largest = 0.0;
  for (float e : expected) largest = std::max(largest, double(std::fabs(e)));
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::fabs(double(actual[i]) - expected[i]);
    if (!(err <= rtol * (std::fabs(expected[i]) + largest))) {
      if (bad < 4) first << " [" << i << "] " << actual[i] << " vs " << expected[i] << ";";
      ++bad;
    }
  }
  if (bad > 0) {
    ADD_FAILURE() << what << ": " << bad << " of " << expected.size() << " elements outside rtol "
                  << rtol << " (scale " << largest << "); first:" << first.str();
  }
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

// ================================================================ device

TEST_F(CudaBackendTest, DescribesTheDevice) {
  const DeviceInfo info = gpu().device_info();
  EXPECT_EQ(info.backend, "cuda");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.memory_bytes, size_t{1} << 28);
  EXPECT_EQ(info.library_version.rfind("cuDNN 9.", 0), 0u) << info.library_version;
  EXPECT_FALSE(info.host.empty());
  EXPECT_EQ(gpu().preferred_layout(64), Layout::kPlain);
  EXPECT_EQ(gpu().pooling_state_bytes({}, desc({2, 3, 4, 4}), desc({2, 3, 2, 2})), 0u);
}

TEST_F(CudaBackendTest, FactoryPicksCudaForAutoWhenAGpuIsVisible) {
  EXPECT_TRUE(gpu_available());
  EXPECT_EQ(make_backend({.kind = "auto"})->device_info().backend, "cuda");
  EXPECT_EQ(make_backend({.kind = "cuda"})->device_info().backend, "cuda");
}

TEST_F(CudaBackendTest, CountsDeviceMemoryAndEnforcesTheLimit) {
  const auto b = cuda::make_cuda_backend({.kind = "cuda", .memory_limit = 1 << 20});
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
  b.scale(device.floats(), count, 2.0f);  // compute uses the prefetched data
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

TEST_F(CudaBackendTest, UploadDownloadConvertAndFillInEveryLayout) {
  Backend& b = gpu();
  std::mt19937 rng(3);
  const Shape s{2, 11, 3, 5};  // channels not a multiple of any block
  const Vec host = random_vec(rng, s.elements());
  for (Layout layout : {Layout::kPlain, Layout::kBlocked8, Layout::kBlocked16}) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor t = to_device(b, host, desc(s, layout));
    EXPECT_EQ(from_device(b, t.tensor), host);
    for (Layout other : {Layout::kPlain, Layout::kBlocked8, Layout::kBlocked16}) {
      DeviceTensor u(b, desc(s, other));
      b.convert(t.tensor, u.tensor);
      EXPECT_EQ(from_device(b, u.tensor), host) << "to " << layout_name(other);
    }
    DeviceTensor filled(b, desc(s, layout));
    b.fill(filled.tensor, kNaN);
    b.fill(filled.tensor, 2.5f);
    EXPECT_EQ(from_device(b, filled.tensor), Vec(host.size(), 2.5f));
    // Padding channels hold zeros: the whole storage sums to 2.5 * elements.
    const Vec storage = from_device(b, filled.tensor.data, filled.tensor.desc.storage_elements());
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

struct ConvCase {
  const char* name;
  int64_t c, h, w;
  int64_t k, r;
  int64_t pad, stride;
  int64_t n;
};

// Names the case in test names and messages instead of dumping its bytes.
void PrintTo(const ConvCase& cc, std::ostream* os) { *os << cc.name; }

const ConvCase kConvCases[] = {
    {"lenet_conv1_5x5", 1, 28, 28, 6, 5, 0, 1, 4},
    {"3x3_pad1_16to16", 16, 10, 10, 16, 3, 1, 1, 3},
    {"3x3_stride2_8to12", 8, 11, 11, 12, 3, 1, 2, 2},
    {"1x1_24to8", 24, 7, 7, 8, 1, 0, 1, 2},
    {"7x7_stride2_pad3", 3, 20, 20, 8, 7, 3, 2, 2},
};

ConvProblem conv_problem(const ConvCase& cc) {
  ConvProblem p{.x = desc({cc.n, cc.c, cc.h, cc.w}),
                .y = {},
                .k = cc.k,
                .r = cc.r,
                .s = cc.r,
                .pad_h = cc.pad,
                .pad_w = cc.pad,
                .stride_h = cc.stride,
                .stride_w = cc.stride};
  p.y = desc(p.output_shape());
  return p;
}

struct ConvData {
  explicit ConvData(const ConvProblem& problem) : p(problem) {
    std::mt19937 rng(static_cast<unsigned>(p.x.shape.c * 1000 + p.k * 10 + p.x.shape.n));
    x = random_vec(rng, p.x.shape.elements());
    w = random_vec(rng, p.weight_shape().elements());
    bias = random_vec(rng, p.k);
    dy = random_vec(rng, p.y.shape.elements());
    y_ref = reference::conv_forward(p, x, w, bias);
    dx_ref = reference::conv_backward_data(p, dy, w);
    dw_ref = reference::conv_backward_filter(p, x, dy, &dbias_ref);
  }
  ConvProblem p;
  Vec x, w, bias, dy;
  Vec y_ref, dx_ref, dw_ref, dbias_ref;
};

// The results of one kind with one algorithm and beta on `b`, starting from
// `previous` outputs (NaN where beta = 0): {y} or {dx} or {dw, dbias}.
std::vector<Vec> run_conv(Backend& b, ConvKind kind, const ConvAlgoInfo& info, const ConvData& d,
                          float beta, const std::vector<Vec>& previous) {
  const ConvProblem& p = d.p;
  DeviceBuffer workspace(b, info.workspace_bytes);
  const DeviceBuffer w = to_device(b, d.w);
  auto start = [&](const Vec& v) { return beta == 0.0f ? Vec(v.size(), kNaN) : v; };
  switch (kind) {
    case ConvKind::kForward: {
      const DeviceTensor x = to_device(b, d.x, p.x);
      const DeviceBuffer bias = to_device(b, d.bias);
      const DeviceTensor y = to_device(b, start(previous[0]), p.y);
      b.conv_forward(info.algo, p, x.tensor, w.floats(), bias.floats(), y.tensor, beta,
                     workspace.get(), info.workspace_bytes);
      return {from_device(b, y.tensor)};
    }
    case ConvKind::kBackwardData: {
      const DeviceTensor dy = to_device(b, d.dy, p.y);
      const DeviceTensor dx = to_device(b, start(previous[0]), p.x);
      b.conv_backward_data(info.algo, p, dy.tensor, w.floats(), dx.tensor, beta, workspace.get(),
                           info.workspace_bytes);
      return {from_device(b, dx.tensor)};
    }
    case ConvKind::kBackwardFilter: {
      const DeviceTensor x = to_device(b, d.x, p.x);
      const DeviceTensor dy = to_device(b, d.dy, p.y);
      const DeviceBuffer dw = to_device(b, start(previous[0]));
      const DeviceBuffer db = to_device(b, start(previous[1]));
      b.conv_backward_filter(info.algo, p, x.tensor, dy.tensor, dw.floats(), db.floats(), beta,
                             workspace.get(), info.workspace_bytes);
      return {from_device(b, dw.floats(), p.weight_shape().elements()),
              from_device(b, db.floats(), p.k)};
    }
  }
  return {};
}

class CudaConvTest : public ::testing::TestWithParam<ConvCase> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

TEST_P(CudaConvTest, EveryAlgorithmAndBetaMatchesTheReferenceAndTheCpuBackend) {
  const ConvData d(conv_problem(GetParam()));
  std::mt19937 rng(5);
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const std::vector<ConvAlgoInfo> algos = gpu().conv_algorithms(kind, d.p, true);
    ASSERT_FALSE(algos.empty()) << conv_kind_name(kind);
    const ConvAlgoInfo cpu_algo = cpu().conv_algorithms(kind, d.p, true).front();
    std::vector<Vec> reference, previous;
    switch (kind) {
      case ConvKind::kForward:
        reference = {d.y_ref};
        previous = {random_vec(rng, d.p.y.shape.elements())};
        break;
      case ConvKind::kBackwardData:
        reference = {d.dx_ref};
        previous = {random_vec(rng, d.p.x.shape.elements())};
        break;
      case ConvKind::kBackwardFilter:
        reference = {d.dw_ref, d.dbias_ref};
        previous = {random_vec(rng, d.p.weight_shape().elements()), random_vec(rng, d.p.k)};
        break;
    }
    for (const ConvAlgoInfo& info : algos) {
      EXPECT_EQ(gpu().conv_algorithm_name(kind, info.algo), info.name);
      EXPECT_EQ(gpu().conv_workspace(kind, info.algo, d.p, true), info.workspace_bytes);
      const bool transform = info.name.find("fft") != std::string::npos ||
                             info.name.find("winograd") != std::string::npos;
      const bool large_winograd = info.name.find("winograd") != std::string::npos &&
                                  std::max(d.p.r, d.p.s) > 3;
      const double rtol = large_winograd ? kLargeWinogradRtol : transform ? kTransformRtol : kSumRtol;
      for (float beta : {0.0f, 1.0f}) {
        const std::string what = std::string(conv_kind_name(kind)) + "/" + info.name +
                                 " beta=" + std::to_string(static_cast<int>(beta));
        const std::vector<Vec> got = run_conv(gpu(), kind, info, d, beta, previous);
        const std::vector<Vec> on_cpu = run_conv(cpu(), kind, cpu_algo, d, beta, previous);
        for (size_t i = 0; i < reference.size(); ++i) {
          const Vec expected = beta == 0.0f ? reference[i] : plus(reference[i], previous[i]);
          expect_close(got[i], expected, rtol, what + " vs reference, output " + std::to_string(i));
          expect_close(got[i], on_cpu[i], rtol, what + " vs cpu, output " + std::to_string(i));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaConvTest, ::testing::ValuesIn(kConvCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(CudaBackendTest, MicroBatchedConvolutionEqualsUndivided) {
  // Two halves: Forward and BackwardData on disjoint slices, BackwardFilter
  // with beta = 0 then 1, so dW and dbias sum over both (mu-cuDNN's bug was
  // passing the caller's beta to every micro-batch).
  ConvProblem p = conv_problem({"mb", 8, 9, 9, 12, 3, 1, 1, 6});
  const ConvData d(p);
  Backend& b = gpu();
  const DeviceTensor x = to_device(b, d.x, p.x);
  const DeviceTensor dy = to_device(b, d.dy, p.y);
  const DeviceBuffer w = to_device(b, d.w);
  const DeviceBuffer bias = to_device(b, d.bias);
  const ConvProblem half = p.with_batch(3);
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const ConvAlgoInfo whole_algo = b.conv_algorithms(kind, p, false).front();
    const ConvAlgoInfo half_algo = b.conv_algorithms(kind, half, false).back();
    DeviceBuffer ws(b, std::max(whole_algo.workspace_bytes, half_algo.workspace_bytes));
    const size_t ws_bytes = std::max(whole_algo.workspace_bytes, half_algo.workspace_bytes);
    const std::string what =
        std::string(conv_kind_name(kind)) + " " + whole_algo.name + " vs " + half_algo.name + " x2";
    switch (kind) {
      case ConvKind::kForward: {
        DeviceTensor whole(b, p.y), parts(b, p.y);
        b.conv_forward(whole_algo.algo, p, x.tensor, w.floats(), bias.floats(), whole.tensor, 0.0f,
                       ws.get(), ws_bytes);
        for (int64_t first : {0, 3}) {
          b.conv_forward(half_algo.algo, half, x.tensor.samples(first, 3), w.floats(),
                         bias.floats(), parts.tensor.samples(first, 3), 0.0f, ws.get(), ws_bytes);
        }
        expect_close(from_device(b, parts.tensor), from_device(b, whole.tensor), kTransformRtol,
                     what);
        break;
      }
      case ConvKind::kBackwardData: {
        DeviceTensor whole(b, p.x), parts(b, p.x);
        b.conv_backward_data(whole_algo.algo, p, dy.tensor, w.floats(), whole.tensor, 0.0f,
                             ws.get(), ws_bytes);
        for (int64_t first : {0, 3}) {
          b.conv_backward_data(half_algo.algo, half, dy.tensor.samples(first, 3), w.floats(),
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
        b.conv_backward_filter(whole_algo.algo, p, x.tensor, dy.tensor, whole_dw.floats(),
                               whole_db.floats(), 0.0f, ws.get(), ws_bytes);
        for (int64_t first : {0, 3}) {
          b.conv_backward_filter(half_algo.algo, half, x.tensor.samples(first, 3),
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
  const ConvProblem p = conv_problem({"err", 4, 6, 6, 4, 3, 1, 1, 2});
  EXPECT_CONTAINS(test_support::error_message<BackendError>(
                      [&] { b.conv_algorithm_name(ConvKind::kForward, 99); }),
                  "implicit_gemm");
  const ConvAlgoInfo info = b.conv_algorithms(ConvKind::kForward, p, false).front();
  DeviceTensor x(b, p.x), y(b, p.y);
  DeviceBuffer w(b, p.weight_shape().elements() * sizeof(float));
  if (info.workspace_bytes > 0) {
    EXPECT_CONTAINS(test_support::error_message<BackendError>([&] {
                      b.conv_forward(info.algo, p, x.tensor, w.floats(), nullptr, y.tensor, 0.0f,
                                     nullptr, info.workspace_bytes - 1);
                    }),
                    "workspace");
  }
  ConvProblem blocked = p;
  blocked.x.layout = Layout::kBlocked8;
  EXPECT_CONTAINS(test_support::error_message<BackendError>(
                      [&] { b.conv_algorithms(ConvKind::kForward, blocked, false); }),
                  "nChw8c");
  EXPECT_THROW(
      b.conv_forward(info.algo, p, x.tensor, w.floats(), nullptr, y.tensor, 0.5f, nullptr, 0),
      BackendError);
}

// =============================================================== other ops

TEST_F(CudaBackendTest, PoolingMatchesTheReference) {
  Backend& b = gpu();
  std::mt19937 rng(7);
  const Shape xs{2, 5, 9, 9};
  const Vec x = random_vec(rng, xs.elements());
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (const PoolParams& p :
         {PoolParams{kind, 2, 2, 2, 2, 0, 0}, PoolParams{kind, 3, 3, 2, 2, 1, 1}}) {
      const std::string what = std::string(kind == PoolKind::kMax ? "max" : "avg") + " k" +
                               std::to_string(p.kh) + " pad" + std::to_string(p.pad_h);
      const Shape ys{xs.n, xs.c, window_output(xs.h, p.kh, p.stride_h, p.pad_h),
                     window_output(xs.w, p.kw, p.stride_w, p.pad_w)};
      const Vec dy = random_vec(rng, ys.elements());
      const DeviceTensor dx_in = to_device(b, x, desc(xs));
      DeviceTensor y(b, desc(ys));
      b.fill(y.tensor, kNaN);
      b.pooling_forward(p, dx_in.tensor, y.tensor, nullptr);
      const Vec y_ref = reference::pooling_forward(p, xs, x);
      expect_close(from_device(b, y.tensor), y_ref, 1e-6, what + " forward");
      const DeviceTensor dyt = to_device(b, dy, desc(ys));
      DeviceTensor dx(b, desc(xs));
      b.fill(dx.tensor, kNaN);
      b.pooling_backward(p, dx_in.tensor, y.tensor, dyt.tensor, dx.tensor, nullptr);
      expect_close(from_device(b, dx.tensor), reference::pooling_backward(p, xs, x, dy), 1e-5,
                   what + " backward");
    }
  }
}

TEST_F(CudaBackendTest, ReluForwardAndBackwardInPlace) {
  Backend& b = gpu();
  std::mt19937 rng(8);
  const Shape s{3, 7, 5, 5};
  const Vec x = random_vec(rng, s.elements());
  const Vec dy = random_vec(rng, s.elements());
  const DeviceTensor xt = to_device(b, x, desc(s));
  DeviceTensor y(b, desc(s));
  b.relu_forward(xt.tensor, y.tensor);
  const Vec y_ref = reference::relu_forward(x);
  EXPECT_EQ(from_device(b, y.tensor), y_ref);
  const DeviceTensor grad = to_device(b, dy, desc(s));
  b.relu_backward(y.tensor, grad.tensor, grad.tensor);  // dx aliases dy
  EXPECT_EQ(from_device(b, grad.tensor), reference::relu_backward(y_ref, dy));
}

TEST_F(CudaBackendTest, InnerProductMatchesTheReference) {
  Backend& b = gpu();
  std::mt19937 rng(9);
  const Shape xs{5, 4, 3, 3};
  const int64_t out = 7, in = xs.per_sample();
  const Vec x = random_vec(rng, xs.elements());
  const Vec w = random_vec(rng, out * in);
  const Vec bias = random_vec(rng, out);
  const Vec dy = random_vec(rng, xs.n * out);
  const DeviceTensor xt = to_device(b, x, desc(xs));
  const DeviceBuffer wt = to_device(b, w);
  const DeviceBuffer bt = to_device(b, bias);
  DeviceTensor y(b, desc({xs.n, out, 1, 1}));
  b.fill(y.tensor, kNaN);
  b.inner_product_forward(xt.tensor, wt.floats(), bt.floats(), y.tensor);
  expect_close(from_device(b, y.tensor), reference::inner_product_forward(xs, x, out, w, bias),
               kSumRtol, "forward");
  const DeviceTensor dyt = to_device(b, dy, desc({xs.n, out, 1, 1}));
  DeviceTensor dx(b, desc(xs));
  b.fill(dx.tensor, kNaN);
  b.inner_product_backward_data(dyt.tensor, wt.floats(), dx.tensor);
  expect_close(from_device(b, dx.tensor), reference::inner_product_backward_data(xs, out, dy, w),
               kSumRtol, "backward data");
  Vec db_ref;
  const Vec dw_ref = reference::inner_product_backward_weights(xs, out, x, dy, &db_ref);
  for (float beta : {0.0f, 1.0f}) {
    const Vec prev_w = beta == 0.0f ? Vec(dw_ref.size(), kNaN) : random_vec(rng, out * in);
    const Vec prev_b = beta == 0.0f ? Vec(db_ref.size(), kNaN) : random_vec(rng, out);
    const DeviceBuffer dw = to_device(b, prev_w);
    const DeviceBuffer db = to_device(b, prev_b);
    b.inner_product_backward_weights(xt.tensor, dyt.tensor, dw.floats(), db.floats(), beta);
    const std::string what = "backward weights beta=" + std::to_string(static_cast<int>(beta));
    expect_close(from_device(b, dw.floats(), out * in),
                 beta == 0.0f ? dw_ref : plus(dw_ref, prev_w), kSumRtol, what);
    expect_close(from_device(b, db.floats(), out), beta == 0.0f ? db_ref : plus(db_ref, prev_b),
                 kSumRtol, what + " bias");
  }
}

TEST_F(CudaBackendTest, BatchNormMatchesTheReferenceAndTheCpuBackend) {
  std::mt19937 rng(10);
  const Shape s{4, 6, 5, 5};
  const int64_t c = s.c;
  const float eps = 1e-5f, momentum = 0.1f;
  const Vec x = random_vec(rng, s.elements(), -2.0f, 3.0f);
  const Vec dy = random_vec(rng, s.elements());
  const Vec gamma = random_vec(rng, c, 0.5f, 1.5f);
  const Vec beta_param = random_vec(rng, c);
  Vec scale_shift = gamma;
  scale_shift.insert(scale_shift.end(), beta_param.begin(), beta_param.end());
  const Vec running_mean0 = random_vec(rng, c), running_var0 = random_vec(rng, c, 0.5f, 2.0f);
  const auto fwd = reference::batch_norm_forward_training(s, x, gamma, beta_param, eps);
  const auto bwd = reference::batch_norm_backward(s, x, dy, gamma, fwd.mean, fwd.var, eps);
  const double m = static_cast<double>(s.n * s.h * s.w);

  for (Backend* b : {&gpu(), &cpu()}) {
    const std::string who = b->device_info().backend;
    const DeviceTensor xt = to_device(*b, x, desc(s));
    DeviceTensor y(*b, desc(s));
    const DeviceBuffer ss = to_device(*b, scale_shift);
    DeviceBuffer save(*b, 2 * c * sizeof(float));
    const DeviceBuffer rm = to_device(*b, running_mean0);
    const DeviceBuffer rv = to_device(*b, running_var0);
    b->batch_norm_forward_training(xt.tensor, y.tensor, ss.floats(), save.floats(),
                                   save.floats() + c, rm.floats(), rv.floats(), momentum, eps);
    expect_close(from_device(*b, y.tensor), fwd.y, kSumRtol, who + " y");
    expect_close(from_device(*b, save.floats(), c), fwd.mean, kSumRtol, who + " save_mean");
    expect_close(from_device(*b, save.floats() + c, c), fwd.var, kSumRtol, who + " save_var");
    Vec rm_ref(c), rv_ref(c);
    for (int64_t i = 0; i < c; ++i) {
      rm_ref[i] = static_cast<float>((1 - momentum) * running_mean0[i] + momentum * fwd.mean[i]);
      rv_ref[i] = static_cast<float>((1 - momentum) * running_var0[i] +
                                     momentum * fwd.var[i] * m / (m - 1));
    }
    expect_close(from_device(*b, rm.floats(), c), rm_ref, kSumRtol, who + " running mean");
    expect_close(from_device(*b, rv.floats(), c), rv_ref, kSumRtol, who + " running var");

    DeviceTensor yi(*b, desc(s));
    b->batch_norm_forward_inference(xt.tensor, yi.tensor, ss.floats(), rm.floats(), rv.floats(),
                                    eps);
    expect_close(
        from_device(*b, yi.tensor),
        reference::batch_norm_forward_inference(s, x, gamma, beta_param, rm_ref, rv_ref, eps),
        kSumRtol, who + " inference");

    const DeviceTensor dyt = to_device(*b, dy, desc(s));
    for (float beta : {0.0f, 1.0f}) {
      const Vec prev = beta == 0.0f ? Vec(2 * c, kNaN) : random_vec(rng, 2 * c);
      const DeviceBuffer dss = to_device(*b, prev);
      DeviceTensor dx(*b, desc(s));
      b->fill(dx.tensor, kNaN);
      b->batch_norm_backward(xt.tensor, dyt.tensor, ss.floats(), save.floats(), save.floats() + c,
                             dx.tensor, dss.floats(), beta, eps);
      const std::string what = who + " backward beta=" + std::to_string(static_cast<int>(beta));
      expect_close(from_device(*b, dx.tensor), bwd.dx, 1e-3, what + " dx");
      Vec d_ref = bwd.dgamma;
      d_ref.insert(d_ref.end(), bwd.dbeta.begin(), bwd.dbeta.end());
      expect_close(from_device(*b, dss.floats(), 2 * c), beta == 0.0f ? d_ref : plus(d_ref, prev),
                   kSumRtol, what + " dscale_shift");
    }
  }
}

TEST_F(CudaBackendTest, AddAccumulateAndScale) {
  Backend& b = gpu();
  std::mt19937 rng(11);
  const Shape s{2, 9, 4, 4};
  const Vec a = random_vec(rng, s.elements()), c = random_vec(rng, s.elements());
  const DeviceTensor at = to_device(b, a, desc(s));
  const DeviceTensor ct = to_device(b, c, desc(s));
  DeviceTensor y(b, desc(s));
  b.add(at.tensor, ct.tensor, y.tensor);
  EXPECT_EQ(from_device(b, y.tensor), plus(a, c));
  b.add(y.tensor, at.tensor, y.tensor);  // y aliases an input
  EXPECT_EQ(from_device(b, y.tensor), plus(plus(a, c), a));
  // Mixed layouts are converted.
  const DeviceTensor blocked = to_device(b, c, desc(s, Layout::kBlocked8));
  b.add(at.tensor, blocked.tensor, y.tensor);
  EXPECT_EQ(from_device(b, y.tensor), plus(a, c));
  b.fill(y.tensor, kNaN);
  b.accumulate(at.tensor, y.tensor, 0.0f);
  EXPECT_EQ(from_device(b, y.tensor), a);
  b.accumulate(blocked.tensor, y.tensor, 1.0f);
  EXPECT_EQ(from_device(b, y.tensor), plus(a, c));
  b.scale(y.tensor.data, s.elements(), 0.5f);
  Vec half = plus(a, c);
  for (float& v : half) v *= 0.5f;
  EXPECT_EQ(from_device(b, y.tensor), half);
}

TEST_F(CudaBackendTest, ConcatForwardAndBackward) {
  Backend& b = gpu();
  std::mt19937 rng(12);
  const std::vector<Shape> shapes{{2, 3, 4, 5}, {2, 8, 4, 5}, {2, 5, 4, 5}};
  std::vector<Vec> xs;
  std::vector<DeviceTensor> devs;
  std::vector<Tensor> tensors;
  for (const Shape& s : shapes) {
    xs.push_back(random_vec(rng, s.elements()));
    devs.push_back(to_device(b, xs.back(), desc(s)));
  }
  for (const DeviceTensor& d : devs) tensors.push_back(d.tensor);
  const Shape ys{2, 16, 4, 5};
  DeviceTensor y(b, desc(ys));
  b.fill(y.tensor, kNaN);
  b.concat_forward(tensors, y.tensor);
  EXPECT_EQ(from_device(b, y.tensor), reference::concat(shapes, xs));
  const Vec dy = random_vec(rng, ys.elements());
  const DeviceTensor dyt = to_device(b, dy, desc(ys));
  const std::vector<Vec> parts = reference::concat_backward(shapes, dy);
  int64_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (float beta : {0.0f, 1.0f}) {
      const Vec prev =
          beta == 0.0f ? Vec(parts[i].size(), kNaN) : random_vec(rng, shapes[i].elements());
      const DeviceTensor dx = to_device(b, prev, desc(shapes[i]));
      b.concat_backward(dyt.tensor, offset, dx.tensor, beta);
      EXPECT_EQ(from_device(b, dx.tensor), beta == 0.0f ? parts[i] : plus(parts[i], prev))
          << "input " << i << " beta " << beta;
    }
    offset += shapes[i].c;
  }
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesTheReference) {
  Backend& b = gpu();
  std::mt19937 rng(13);
  for (int64_t classes : {3, 10, 100}) {
    const int64_t n = 37;
    const Vec logits = random_vec(rng, n * classes, -4.0f, 4.0f);
    std::vector<int32_t> labels(n);
    for (auto& l : labels) l = static_cast<int32_t>(rng() % classes);
    const float scale = 1.0f / 64;
    const auto ref = reference::softmax_cross_entropy(n, classes, logits, labels, scale);
    const DeviceTensor z = to_device(b, logits, desc({n, classes, 1, 1}));
    DeviceBuffer dl(b, n * sizeof(int32_t));
    b.upload_labels(labels.data(), static_cast<int32_t*>(dl.get()), n);
    DeviceTensor dz(b, desc({n, classes, 1, 1}));
    b.fill(dz.tensor, kNaN);
    const LossStats s =
        b.softmax_cross_entropy(z.tensor, static_cast<int32_t*>(dl.get()), scale, &dz.tensor);
    EXPECT_NEAR(s.loss_sum, ref.loss_sum, 1e-9 * n) << classes;
    EXPECT_EQ(s.correct, ref.correct) << classes;
    expect_close(from_device(b, dz.tensor), ref.dlogits, 1e-6, "dlogits");
    const LossStats no_grad =
        b.softmax_cross_entropy(z.tensor, static_cast<int32_t*>(dl.get()), scale, nullptr);
    EXPECT_EQ(no_grad.loss_sum, s.loss_sum);
  }
  const DeviceTensor z = to_device(b, Vec(6, 0.5f), desc({2, 3, 1, 1}));
  std::vector<int32_t> bad{1, 3};
  DeviceBuffer dl(b, 2 * sizeof(int32_t));
  b.upload_labels(bad.data(), static_cast<int32_t*>(dl.get()), 2);
  EXPECT_CONTAINS(test_support::error_message<BackendError>([&] {
                    b.softmax_cross_entropy(z.tensor, static_cast<int32_t*>(dl.get()), 1.0f,
                                            nullptr);
                  }),
                  "label 3 outside [0, 3)");
}

TEST_F(CudaBackendTest, SgdUpdateMatchesTheReference) {
  Backend& b = gpu();
  std::mt19937 rng(14);
  const int64_t count = 100003;
  Vec w = random_vec(rng, count), g = random_vec(rng, count), v = random_vec(rng, count);
  const DeviceBuffer wd = to_device(b, w), gd = to_device(b, g), vd = to_device(b, v);
  const SgdStep step{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f};
  b.sgd_update(wd.floats(), gd.floats(), vd.floats(), count, step);
  reference::sgd_update(w, g, v, step);
  expect_close(from_device(b, wd.floats(), count), w, 1e-6, "w");
  expect_close(from_device(b, vd.floats(), count), v, 1e-6, "velocity");
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
  net.init_parameters(1);
  Sgd sgd(b, net.parameter_count(), 0.9f, 1e-4f);
  std::mt19937 rng(3);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    synthetic_batch(b, net, n, rng);
    const LossStats s = net.train_step(n, 1.0f / static_cast<float>(n));
    sgd.step(net.parameters(), net.gradients(), 0.02f);
    const double loss = s.loss_sum / n;
    ASSERT_TRUE(std::isfinite(loss)) << "step " << step;
    if (step < 5) first += loss / 5;
    if (step >= 55) last += loss / 5;
  }
  EXPECT_LT(last, 0.6 * first) << "mean loss of the first 5 steps " << first << ", last 5 " << last;
  EXPECT_FALSE(net.algorithm_summary().empty());
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

// ================================================================== NCCL

// One MPI runtime for the process (a singleton without mpirun).
MpiRuntime& mpi_runtime() {
  static MpiRuntime runtime(nullptr, nullptr);
  return runtime;
}

// The NCCL communicator's own machinery on one rank: the unique id travels,
// an allreduce queued right after a fill on the compute stream sees the
// filled values (ordered by the event), and wait() returns the sum, which on
// one rank is the buffer itself.
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
  EXPECT_GT(comm->allreduce_seconds(), 0.0);
}

// Uneven per-rank batches summed by NCCL give the full-batch gradient: 20
// steps of vtrain on 2 GPUs with a 40/8 split end with the weights of one
// GPU with the whole batch of 48. Needs one GPU per rank.
TEST_F(CudaBackendTest, NcclUnevenSplitOnTwoGpusMatchesOneGpu) {
  const int gpus = cuda::cuda_device_count();
  if (gpus < 2) GTEST_SKIP() << "NCCL needs one GPU per rank; " << gpus << " visible";
  test_support::TempDir dir;
  auto command = [&](const std::string& launch, const std::string& ckpt,
                     const std::string& extra) {
    return launch + test_support::vtrain_binary() + " " + test_support::source_dir() +
           "/configs/synthetic-lenet.yaml --progress off --set device.backend=cuda"
           " --set conv.algorithm=algo_1 --set train.batch=48 --set train.max_steps=20"
           " --set checkpoint.dir=" + dir.path(ckpt) + " " + extra;
  };
  std::string out;
  ASSERT_EQ(test_support::run_command(command("", "one", ""), &out), 0) << out;
  ASSERT_EQ(test_support::run_command(
                command(test_support::source_dir() + "/scripts/mpirun.sh --oversubscribe -np 2 ",
                        "two", "--set balance.split=manual --set 'balance.manual=[40,8]'"),
                &out),
            0)
      << out;
  const auto one = load_checkpoint(*latest_checkpoint(dir.path("one"))).parameters;
  const auto two = load_checkpoint(*latest_checkpoint(dir.path("two"))).parameters;
  ASSERT_EQ(one.size(), two.size());
  double max_abs = 0, scale = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    max_abs = std::max(max_abs, double(std::fabs(one[i] - two[i])));
    scale = std::max(scale, double(std::fabs(one[i])));
  }
  EXPECT_LE(max_abs, 1e-5 * scale) << "max |diff| " << max_abs << ", weights' scale " << scale;
}

}  // namespace
}  // namespace vtrain::worker
