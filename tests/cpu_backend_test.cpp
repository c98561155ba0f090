// The CPU backend against the reference ops, through the Backend interface
// only: device memory from allocate_device, data in and out with upload() and
// download(), results compared with tests/reference_ops on plain host vectors.
//
// Outputs written with beta = 0 are first filled with NaN: memory from the
// pool holds whatever the previous user left, so beta = 0 must not read it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/reference_ops.h"
#include "worker/device/backend.h"

namespace vtrain::worker {
namespace {

using reference::Vec;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The backend most tests share: creating one per test would only add oneDNN
// start-up time. Tests that need options of their own make their own.
Backend& cpu() {
  static const std::unique_ptr<Backend> backend = make_backend({.kind = "cpu"});
  return *backend;
}

// ------------------------------------------------------------ memory helpers

// Device memory owned for the scope of a test. A zero-byte buffer holds
// nullptr without calling the backend: a zero workspace is legal, and the test
// must not depend on what allocate_device(0) returns.
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

class PinnedBuffer {
 public:
  PinnedBuffer(Backend& backend, size_t bytes)
      : backend_(&backend), ptr_(backend.allocate_pinned(bytes)) {}
  ~PinnedBuffer() { backend_->free_pinned(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* get() const { return ptr_; }

 private:
  Backend* backend_;
  void* ptr_;
};

// A tensor together with the device memory behind it.
struct DeviceTensor {
  DeviceTensor(Backend& backend, const TensorDesc& desc)
      : memory(backend, desc.bytes()), tensor{desc, memory.floats()} {}
  DeviceBuffer memory;
  Tensor tensor;
};

// A plain view of `count` floats, for uploading and downloading parameter
// arrays (weights, statistics) that the ops take as raw pointers.
Tensor flat(float* data, int64_t count) {
  return Tensor{TensorDesc{.shape = {1, count, 1, 1}, .layout = Layout::kPlain}, data};
}

DeviceTensor to_device(const Vec& host, const TensorDesc& desc) {
  EXPECT_EQ(static_cast<int64_t>(host.size()), desc.shape.elements());
  DeviceTensor t(cpu(), desc);
  cpu().upload(host.data(), t.tensor);
  return t;
}

DeviceBuffer to_device(const Vec& host) {
  DeviceBuffer buffer(cpu(), host.size() * sizeof(float));
  cpu().upload(host.data(), flat(buffer.floats(), static_cast<int64_t>(host.size())));
  return buffer;
}

Vec from_device(const Tensor& t) {
  Vec host(static_cast<size_t>(t.shape().elements()));
  cpu().download(t, host.data());
  return host;
}

Vec from_device(const float* data, int64_t count) {
  Vec host(static_cast<size_t>(count));
  cpu().download(flat(const_cast<float*>(data), count), host.data());
  return host;
}

TensorDesc desc(Shape shape, Layout layout = Layout::kPlain) {
  return TensorDesc{.shape = shape, .layout = layout};
}

// ------------------------------------------------------------ data helpers

Vec random_vec(std::mt19937& rng, int64_t count, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

Vec plus(const Vec& a, const Vec& b) { return reference::add(a, b); }

// Plain, then the backend's preferred layout for this channel count if it
// differs: every op must accept both.
std::vector<Layout> layouts_for(int64_t channels) {
  std::vector<Layout> layouts = {Layout::kPlain};
  if (cpu().preferred_layout(channels) != Layout::kPlain)
    layouts.push_back(cpu().preferred_layout(channels));
  return layouts;
}

// ------------------------------------------------------------ comparisons

// Elementwise |actual - expected| <= rtol * (|expected| + largest |expected|):
// a sum with cancellation carries an absolute error proportional to its terms,
// not to its result, so small outputs of large sums get the scale of the
// tensor. Reports the count, the worst element and the first few mismatches.
void expect_close(const Vec& actual, const Vec& expected, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double largest = 0.0;
  for (float e : expected) largest = std::max(largest, double(std::fabs(e)));
  size_t bad = 0;
  size_t worst = 0;
  double worst_ratio = -1.0;
  std::ostringstream first;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::fabs(double(actual[i]) - expected[i]);
    const double tol = rtol * (std::fabs(expected[i]) + largest);
    const double ratio = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / tol;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
    if (!(err <= tol)) {
      if (bad < 4) first << " [" << i << "] " << actual[i] << " vs " << expected[i] << ";";
      ++bad;
    }
  }
  if (bad > 0) {
    ADD_FAILURE() << what << ": " << bad << " of " << expected.size() << " elements outside rtol "
                  << rtol << " (scale " << largest << "); worst [" << worst << "] " << actual[worst]
                  << " vs " << expected[worst] << " (" << worst_ratio
                  << "x tolerance); first:" << first.str();
  }
}

void expect_equal(const Vec& actual, const Vec& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!(actual[i] == expected[i])) {
      if (bad < 4) first << " [" << i << "] " << actual[i] << " vs " << expected[i] << ";";
      ++bad;
    }
  }
  if (bad > 0) {
    ADD_FAILURE() << what << ": " << bad << " of " << expected.size()
                  << " elements differ; first:" << first.str();
  }
}

// Tolerance for convolution, inner product and batch norm (float sums of up
// to a few thousand terms against a double reference).
constexpr double kSumRtol = 1e-4;

// ============================================================== convolution

struct ConvCase {
  const char* name;
  int64_t c, h, w;  // input channels and size
  int64_t k, r;     // output channels, square filter size
  int64_t pad, stride;
  int64_t n;             // batch
  bool expect_winograd;  // 3x3, stride 1, channels multiples of 16
};

// Names the case in failure messages instead of dumping its bytes.
void PrintTo(const ConvCase& cc, std::ostream* os) { *os << cc.name; }

ConvProblem conv_problem(const ConvCase& cc, Layout x_layout = Layout::kPlain,
                         Layout y_layout = Layout::kPlain) {
  ConvProblem p{.x = desc({cc.n, cc.c, cc.h, cc.w}, x_layout),
                .y = {},
                .k = cc.k,
                .r = cc.r,
                .s = cc.r,
                .pad_h = cc.pad,
                .pad_w = cc.pad,
                .stride_h = cc.stride,
                .stride_w = cc.stride};
  p.y = desc(p.output_shape(), y_layout);
  return p;
}

// Activation layout pairs (x, y): both plain, both preferred, and mixed.
std::vector<std::pair<Layout, Layout>> conv_layouts(const ConvCase& cc) {
  const Layout px = cpu().preferred_layout(cc.c);
  const Layout py = cpu().preferred_layout(cc.k);
  std::vector<std::pair<Layout, Layout>> pairs = {{Layout::kPlain, Layout::kPlain}};
  for (auto pair :
       {std::pair{px, py}, std::pair{Layout::kPlain, py}, std::pair{px, Layout::kPlain}})
    if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) pairs.push_back(pair);
  return pairs;
}

constexpr ConvKind kConvKinds[] = {ConvKind::kForward, ConvKind::kBackwardData,
                                   ConvKind::kBackwardFilter};

// Host data and reference results of one convolution case.
struct ConvData {
  explicit ConvData(const ConvCase& cc) : p(conv_problem(cc)) {
    std::mt19937 rng(static_cast<unsigned>(cc.c * 1000 + cc.k * 10 + cc.n));
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

std::vector<std::string> algorithm_names(const std::vector<ConvAlgoInfo>& algos) {
  std::vector<std::string> names;
  for (const ConvAlgoInfo& a : algos) names.push_back(a.name);
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return "{" + s + "}";
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Runs one algorithm of one kind with beta and checks the result against
// reference + beta * previous contents.
void run_and_check_conv(ConvKind kind, const ConvAlgoInfo& info, const ConvProblem& p,
                        const ConvData& d, float beta) {
  Backend& b = cpu();
  std::mt19937 rng(static_cast<unsigned>(info.algo + 17));
  DeviceBuffer workspace(b, info.workspace_bytes);
  const DeviceBuffer w = to_device(d.w);
  const std::string what =
      std::string(conv_kind_name(kind)) + "/" + info.name + " beta=" + std::to_string(int(beta));
  switch (kind) {
    case ConvKind::kForward: {
      const DeviceTensor x = to_device(d.x, p.x);
      const DeviceBuffer bias = to_device(d.bias);
      const Vec previous = random_vec(rng, p.y.shape.elements());
      const DeviceTensor y = to_device(previous, p.y);
      if (beta == 0.0f) b.fill(y.tensor, kNaN);
      b.conv_forward(info.algo, p, x.tensor, w.floats(), bias.floats(), y.tensor, beta,
                     workspace.get(), info.workspace_bytes);
      expect_close(from_device(y.tensor), beta == 0.0f ? d.y_ref : plus(d.y_ref, previous),
                   kSumRtol, what + " y");
      break;
    }
    case ConvKind::kBackwardData: {
      const DeviceTensor dy = to_device(d.dy, p.y);
      const Vec previous = random_vec(rng, p.x.shape.elements());
      const DeviceTensor dx = to_device(previous, p.x);
      if (beta == 0.0f) b.fill(dx.tensor, kNaN);
      b.conv_backward_data(info.algo, p, dy.tensor, w.floats(), dx.tensor, beta, workspace.get(),
                           info.workspace_bytes);
      expect_close(from_device(dx.tensor), beta == 0.0f ? d.dx_ref : plus(d.dx_ref, previous),
                   kSumRtol, what + " dx");
      break;
    }
    case ConvKind::kBackwardFilter: {
      const DeviceTensor x = to_device(d.x, p.x);
      const DeviceTensor dy = to_device(d.dy, p.y);
      Vec previous_dw = random_vec(rng, p.weight_shape().elements());
      Vec previous_db = random_vec(rng, p.k);
      if (beta == 0.0f) {
        previous_dw.assign(previous_dw.size(), kNaN);
        previous_db.assign(previous_db.size(), kNaN);
      }
      const DeviceBuffer dw = to_device(previous_dw);
      const DeviceBuffer db = to_device(previous_db);
      b.conv_backward_filter(info.algo, p, x.tensor, dy.tensor, dw.floats(), db.floats(), beta,
                             workspace.get(), info.workspace_bytes);
      const int64_t dw_count = p.weight_shape().elements();
      expect_close(from_device(dw.floats(), dw_count),
                   beta == 0.0f ? d.dw_ref : plus(d.dw_ref, previous_dw), kSumRtol, what + " dw");
      expect_close(from_device(db.floats(), p.k),
                   beta == 0.0f ? d.dbias_ref : plus(d.dbias_ref, previous_db), kSumRtol,
                   what + " dbias");
      break;
    }
  }
}

class CpuConvTest : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CpuConvTest, EveryListedAlgorithmMatchesReference) {
  const ConvCase& cc = GetParam();
  const ConvData d(cc);
  for (const auto& [x_layout, y_layout] : conv_layouts(cc)) {
    const ConvProblem p = conv_problem(cc, x_layout, y_layout);
    SCOPED_TRACE(p.str());
    for (ConvKind kind : kConvKinds) {
      const std::vector<ConvAlgoInfo> algos = cpu().conv_algorithms(kind, p, false);
      const std::vector<std::string> names = algorithm_names(algos);
      EXPECT_TRUE(contains(names, "direct"))
          << conv_kind_name(kind) << " lists " << joined(names) << ", no \"direct\"";
      EXPECT_TRUE(contains(names, "im2col_gemm"))
          << conv_kind_name(kind) << " lists " << joined(names) << ", no \"im2col_gemm\"";
      // oneDNN has f32 winograd on AVX-512 only, where the backend blocks
      // channels by 16.
      if (cc.expect_winograd && cpu().preferred_layout(16) == Layout::kBlocked16) {
        EXPECT_TRUE(contains(names, "winograd"))
            << conv_kind_name(kind) << " lists " << joined(names)
            << ": expected \"winograd\" for a 3x3 stride-1 problem with 16-multiple channels";
      }
      for (const ConvAlgoInfo& info : algos) {
        EXPECT_EQ(info.name, cpu().conv_algorithm_name(kind, info.algo));
        EXPECT_EQ(info.workspace_bytes, cpu().conv_workspace(kind, info.algo, p, false))
            << conv_kind_name(kind) << "/" << info.name;
        run_and_check_conv(kind, info, p, d, 0.0f);
      }
    }
  }
}

// beta = 1 adds to the previous contents (micro-batched gradients rely on
// it), with the workspace each algorithm reports for accumulation.
TEST_P(CpuConvTest, BetaOneAccumulatesWithAccumulateWorkspace) {
  const ConvCase& cc = GetParam();
  const ConvData d(cc);
  for (Layout layout : layouts_for(cc.c)) {
    const ConvProblem p = conv_problem(cc, layout, cpu().preferred_layout(cc.k));
    SCOPED_TRACE(p.str());
    for (ConvKind kind : kConvKinds) {
      for (const ConvAlgoInfo& info : cpu().conv_algorithms(kind, p, true)) {
        EXPECT_EQ(info.workspace_bytes, cpu().conv_workspace(kind, info.algo, p, true))
            << conv_kind_name(kind) << "/" << info.name;
        run_and_check_conv(kind, info, p, d, 1.0f);
      }
    }
  }
}

const ConvCase kConvCases[] = {
    {"lenet1_n1", 1, 28, 28, 20, 5, 0, 1, 1, false},
    {"lenet1_n4", 1, 28, 28, 20, 5, 0, 1, 4, false},
    {"lenet2_n1", 20, 12, 12, 50, 5, 0, 1, 1, false},
    {"lenet2_n4", 20, 12, 12, 50, 5, 0, 1, 4, false},
    {"c16k32_3x3_pad1_n1", 16, 14, 14, 32, 3, 1, 1, 1, true},
    {"c16k32_3x3_pad1_n4", 16, 14, 14, 32, 3, 1, 1, 4, true},
    {"c3k8_3x3_stride2_n1", 3, 15, 15, 8, 3, 1, 2, 1, false},
    {"c3k8_3x3_stride2_n4", 3, 15, 15, 8, 3, 1, 2, 4, false},
};

INSTANTIATE_TEST_SUITE_P(Problems, CpuConvTest, ::testing::ValuesIn(kConvCases),
                         [](const ::testing::TestParamInfo<ConvCase>& info) {
                           return std::string(info.param.name);
                         });

// `auto` takes the CPU where no GPU is visible, on any build and machine: the
// GPUs are hidden before CUDA is first touched (ctest runs every test in a
// process of its own). Asking for cuda then says why it cannot be had.
TEST(BackendFactory, AutoTakesTheCpuWhereNoGpuIsVisible) {
  ASSERT_EQ(setenv("CUDA_VISIBLE_DEVICES", "", 1), 0);
  EXPECT_FALSE(gpu_available());
  EXPECT_EQ(make_backend({.kind = "auto", .threads = 1})->device_info().backend, "cpu");
  std::string why;
  try {
    make_backend({.kind = "cuda", .threads = 1});
  } catch (const BackendError& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("backend 'cuda'"), std::string::npos) << why;
  EXPECT_NE(why.find(" cpu"), std::string::npos) << why;
}

TEST(CpuBackend, ConvWithoutBiasOrDbias) {
  const ConvData d(kConvCases[6]);
  const ConvProblem& p = d.p;
  const Vec y_ref = reference::conv_forward(p, d.x, d.w, {});
  const DeviceTensor x = to_device(d.x, p.x);
  const DeviceTensor dy = to_device(d.dy, p.y);
  const DeviceBuffer w = to_device(d.w);
  for (const ConvAlgoInfo& info : cpu().conv_algorithms(ConvKind::kForward, p, false)) {
    DeviceBuffer ws(cpu(), info.workspace_bytes);
    DeviceTensor y(cpu(), p.y);
    cpu().fill(y.tensor, kNaN);
    cpu().conv_forward(info.algo, p, x.tensor, w.floats(), nullptr, y.tensor, 0.0f, ws.get(),
                       info.workspace_bytes);
    expect_close(from_device(y.tensor), y_ref, kSumRtol, "Forward/" + info.name + " no bias");
  }
  for (const ConvAlgoInfo& info : cpu().conv_algorithms(ConvKind::kBackwardFilter, p, false)) {
    DeviceBuffer ws(cpu(), info.workspace_bytes);
    DeviceBuffer dw(cpu(), d.dw_ref.size() * sizeof(float));
    cpu().conv_backward_filter(info.algo, p, x.tensor, dy.tensor, dw.floats(), nullptr, 0.0f,
                               ws.get(), info.workspace_bytes);
    expect_close(from_device(dw.floats(), static_cast<int64_t>(d.dw_ref.size())), d.dw_ref,
                 kSumRtol, "BackwardFilter/" + info.name + " no dbias");
  }
}

// im2col + GEMM lowers the whole batch at once: its workspace is the
// algorithm's memory/time trade-off and must grow with the batch.
TEST(CpuBackend, Im2colWorkspaceGrowsWithBatch) {
  const ConvProblem p1 = conv_problem({"lenet2", 20, 12, 12, 50, 5, 0, 1, 1, false});
  const ConvProblem p8 = p1.with_batch(8);
  for (ConvKind kind : kConvKinds) {
    std::optional<size_t> ws1, ws8;
    for (const ConvAlgoInfo& info : cpu().conv_algorithms(kind, p1, false))
      if (info.name == "im2col_gemm") ws1 = info.workspace_bytes;
    for (const ConvAlgoInfo& info : cpu().conv_algorithms(kind, p8, false))
      if (info.name == "im2col_gemm") ws8 = info.workspace_bytes;
    ASSERT_TRUE(ws1 && ws8) << conv_kind_name(kind) << ": im2col_gemm not listed";
    EXPECT_GT(*ws8, *ws1) << conv_kind_name(kind) << ": n=1 " << *ws1 << " B, n=8 " << *ws8 << " B";
  }
}

TEST(CpuBackend, WorkspaceOfUnsupportedAlgorithmThrows) {
  // Find winograd's id on a problem it supports, then ask for a stride-2 one.
  const ConvProblem supported = conv_problem(kConvCases[4]);
  const ConvProblem strided = conv_problem(kConvCases[6]);
  for (const ConvAlgoInfo& info : cpu().conv_algorithms(ConvKind::kForward, supported, false)) {
    if (info.name != "winograd") continue;
    EXPECT_THROW(cpu().conv_workspace(ConvKind::kForward, info.algo, strided, false), BackendError);
    return;
  }
  GTEST_SKIP() << "winograd not listed on this CPU; nothing unsupported to ask for";
}

// ================================================================ relu

TEST(CpuBackend, ReluForwardAndBackward) {
  std::mt19937 rng(11);
  const Shape shape{2, 20, 6, 6};
  const Vec x = random_vec(rng, shape.elements());
  const Vec dy = random_vec(rng, shape.elements());
  const Vec y_ref = reference::relu_forward(x);
  const Vec dx_ref = reference::relu_backward(y_ref, dy);
  for (Layout layout : layouts_for(shape.c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(x, desc(shape, layout));
    DeviceTensor yt(cpu(), desc(shape, layout));
    cpu().fill(yt.tensor, kNaN);
    cpu().relu_forward(xt.tensor, yt.tensor);
    expect_equal(from_device(yt.tensor), y_ref, "relu y");

    DeviceTensor dxt(cpu(), desc(shape, layout));
    const DeviceTensor dyt = to_device(dy, desc(shape, layout));
    cpu().fill(dxt.tensor, kNaN);
    cpu().relu_backward(yt.tensor, dyt.tensor, dxt.tensor);
    expect_equal(from_device(dxt.tensor), dx_ref, "relu dx");
    // dx may alias dy.
    cpu().relu_backward(yt.tensor, dyt.tensor, dyt.tensor);
    expect_equal(from_device(dyt.tensor), dx_ref, "relu dx aliasing dy");
  }
}

// ============================================================== pooling

struct PoolCase {
  PoolParams params;
  Shape x;
};

std::string pool_name(const PoolCase& pc) {
  return std::string(pc.params.kind == PoolKind::kMax ? "max" : "avg") + " k" +
         std::to_string(pc.params.kh) + " s" + std::to_string(pc.params.stride_h) + " p" +
         std::to_string(pc.params.pad_h) + " x=" + pc.x.str();
}

TEST(CpuBackend, PoolingForwardAndBackward) {
  std::mt19937 rng(12);
  const PoolParams k2s2{.kind = PoolKind::kMax, .kh = 2, .kw = 2, .stride_h = 2, .stride_w = 2};
  const PoolParams k3s2p1{.kind = PoolKind::kMax,
                          .kh = 3,
                          .kw = 3,
                          .stride_h = 2,
                          .stride_w = 2,
                          .pad_h = 1,
                          .pad_w = 1};
  std::vector<PoolCase> cases;
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    for (PoolParams p : {k2s2, k3s2p1}) {
      p.kind = kind;
      cases.push_back({p, {2, 20, 12, 12}});
      cases.push_back({p, {2, 16, 13, 13}});
    }
  }
  for (const PoolCase& pc : cases) {
    const PoolParams& p = pc.params;
    const Shape ys{pc.x.n, pc.x.c, window_output(pc.x.h, p.kh, p.stride_h, p.pad_h),
                   window_output(pc.x.w, p.kw, p.stride_w, p.pad_w)};
    const Vec x = random_vec(rng, pc.x.elements());
    const Vec dy = random_vec(rng, ys.elements());
    const Vec y_ref = reference::pooling_forward(p, pc.x, x);
    const Vec dx_ref = reference::pooling_backward(p, pc.x, x, dy);
    // Max forward selects an input and non-overlapping max backward routes one
    // gradient per input: both exact. Averages and overlapping windows sum.
    const bool exact_forward = p.kind == PoolKind::kMax;
    const bool exact_backward = exact_forward && p.kh <= p.stride_h;
    for (Layout layout : layouts_for(pc.x.c)) {
      SCOPED_TRACE(pool_name(pc) + " " + layout_name(layout));
      const DeviceTensor xt = to_device(x, desc(pc.x, layout));
      DeviceTensor yt(cpu(), desc(ys, layout));
      DeviceBuffer state(cpu(), cpu().pooling_state_bytes(p, xt.tensor.desc, yt.tensor.desc));
      cpu().fill(yt.tensor, kNaN);
      cpu().pooling_forward(p, xt.tensor, yt.tensor, state.get());
      if (exact_forward) {
        expect_equal(from_device(yt.tensor), y_ref, "pool y");
      } else {
        expect_close(from_device(yt.tensor), y_ref, 1e-6, "pool y");
      }
      const DeviceTensor dyt = to_device(dy, desc(ys, layout));
      DeviceTensor dxt(cpu(), desc(pc.x, layout));
      cpu().fill(dxt.tensor, kNaN);
      cpu().pooling_backward(p, xt.tensor, yt.tensor, dyt.tensor, dxt.tensor, state.get());
      if (exact_backward) {
        expect_equal(from_device(dxt.tensor), dx_ref, "pool dx");
      } else {
        expect_close(from_device(dxt.tensor), dx_ref, 1e-6, "pool dx");
      }
    }
  }
}

// ========================================================= inner product

// Forward, backward-data and backward-weights (beta 0, then 1) of one inner
// product with activations in the given layouts.
void check_inner_product(const Shape& xs, int64_t out, Layout x_layout, Layout y_layout,
                         unsigned seed) {
  SCOPED_TRACE("x=" + xs.str() + " " + layout_name(x_layout) + ", y " + layout_name(y_layout));
  std::mt19937 rng(seed);
  const Shape ys{xs.n, out, 1, 1};
  const int64_t weights = out * xs.per_sample();
  const Vec x = random_vec(rng, xs.elements());
  const Vec w = random_vec(rng, weights);
  const Vec bias = random_vec(rng, out);
  const Vec dy = random_vec(rng, ys.elements());
  const Vec y_ref = reference::inner_product_forward(xs, x, out, w, bias);
  const Vec dx_ref = reference::inner_product_backward_data(xs, out, dy, w);
  Vec db_ref;
  const Vec dw_ref = reference::inner_product_backward_weights(xs, out, x, dy, &db_ref);

  const DeviceBuffer wd = to_device(w);
  const DeviceBuffer bd = to_device(bias);
  const DeviceTensor xt = to_device(x, desc(xs, x_layout));
  DeviceTensor yt(cpu(), desc(ys, y_layout));
  cpu().fill(yt.tensor, kNaN);
  cpu().inner_product_forward(xt.tensor, wd.floats(), bd.floats(), yt.tensor);
  expect_close(from_device(yt.tensor), y_ref, kSumRtol, "fc y");

  const DeviceTensor dyt = to_device(dy, desc(ys, y_layout));
  DeviceTensor dxt(cpu(), desc(xs, x_layout));
  cpu().fill(dxt.tensor, kNaN);
  cpu().inner_product_backward_data(dyt.tensor, wd.floats(), dxt.tensor);
  expect_close(from_device(dxt.tensor), dx_ref, kSumRtol, "fc dx");

  DeviceBuffer dw(cpu(), weights * sizeof(float));
  DeviceBuffer db(cpu(), out * sizeof(float));
  cpu().fill(flat(dw.floats(), weights), kNaN);
  cpu().fill(flat(db.floats(), out), kNaN);
  cpu().inner_product_backward_weights(xt.tensor, dyt.tensor, dw.floats(), db.floats(), 0.0f);
  expect_close(from_device(dw.floats(), weights), dw_ref, kSumRtol, "fc dw");
  expect_close(from_device(db.floats(), out), db_ref, kSumRtol, "fc dbias");
  // beta = 1 adds the same gradients again.
  cpu().inner_product_backward_weights(xt.tensor, dyt.tensor, dw.floats(), db.floats(), 1.0f);
  expect_close(from_device(dw.floats(), weights), plus(dw_ref, dw_ref), kSumRtol, "fc dw beta=1");
  expect_close(from_device(db.floats(), out), plus(db_ref, db_ref), kSumRtol, "fc dbias beta=1");
}

// A flat input, and a conv-shaped one (flattened in NCHW order whatever its
// layout), into a plain output.
TEST(CpuBackend, InnerProductForwardAndBackward) {
  for (Layout layout : layouts_for(100))
    check_inner_product({8, 100, 1, 1}, 10, layout, Layout::kPlain, 13);
  for (Layout layout : layouts_for(50))
    check_inner_product({4, 50, 4, 4}, 120, layout, Layout::kPlain, 14);
}

// The contract lets every activation take any layout, the {n, out, 1, 1}
// output of an inner product included.
TEST(CpuBackend, InnerProductOutputMustBePlain) {
  // backend.h: inner-product outputs are kPlain {n, out, 1, 1}; anything
  // else is a clear error rather than a silent reorder.
  const Layout y_layout = cpu().preferred_layout(120);
  if (y_layout == Layout::kPlain) GTEST_SKIP() << "plain is preferred for 120 channels";
  const DeviceTensor xt(cpu(), desc({4, 50, 4, 4}, cpu().preferred_layout(50)));
  const DeviceBuffer wd = to_device(Vec(static_cast<size_t>(120 * 50 * 16), 0.0f));
  DeviceTensor yt(cpu(), desc({4, 120, 1, 1}, y_layout));
  try {
    cpu().inner_product_forward(xt.tensor, wd.floats(), nullptr, yt.tensor);
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("must be plain"), std::string::npos) << e.what();
  }
}

TEST(CpuBackend, InnerProductWithoutBias) {
  std::mt19937 rng(14);
  const Shape xs{3, 7, 1, 1};
  const int64_t out = 5;
  const Vec x = random_vec(rng, xs.elements());
  const Vec w = random_vec(rng, out * 7);
  const DeviceTensor xt = to_device(x, desc(xs));
  const DeviceBuffer wd = to_device(w);
  DeviceTensor yt(cpu(), desc({3, out, 1, 1}));
  cpu().inner_product_forward(xt.tensor, wd.floats(), nullptr, yt.tensor);
  expect_close(from_device(yt.tensor), reference::inner_product_forward(xs, x, out, w, {}),
               kSumRtol, "fc y without bias");
}

// =========================================================== batch norm

TEST(CpuBackend, BatchNormTrainingInferenceAndBackward) {
  std::mt19937 rng(15);
  const Shape s{4, 20, 6, 6};
  const int64_t c = s.c;
  const float eps = 1e-5f;
  const float momentum = 0.1f;
  const Vec x = random_vec(rng, s.elements(), -1.0f, 3.0f);
  const Vec gamma = random_vec(rng, c, 0.5f, 1.5f);
  const Vec beta = random_vec(rng, c);
  Vec scale_shift = gamma;
  scale_shift.insert(scale_shift.end(), beta.begin(), beta.end());
  const Vec running_mean0 = random_vec(rng, c);
  const Vec running_var0 = random_vec(rng, c, 0.5f, 2.0f);
  const Vec dy = random_vec(rng, s.elements());

  const reference::BatchNormForward fwd =
      reference::batch_norm_forward_training(s, x, gamma, beta, eps);
  const reference::BatchNormBackward back =
      reference::batch_norm_backward(s, x, dy, gamma, fwd.mean, fwd.var, eps);
  const Vec inference_ref =
      reference::batch_norm_forward_inference(s, x, gamma, beta, running_mean0, running_var0, eps);
  // running = (1 - momentum) * running + momentum * batch, with the unbiased
  // batch variance.
  const double m = double(s.n * s.h * s.w);
  Vec running_mean_ref(c), running_var_ref(c);
  for (int64_t i = 0; i < c; ++i) {
    running_mean_ref[i] = float((1 - momentum) * double(running_mean0[i]) + momentum * fwd.mean[i]);
    running_var_ref[i] =
        float((1 - momentum) * double(running_var0[i]) + momentum * fwd.var[i] * m / (m - 1));
  }
  Vec dscale_shift_ref = back.dgamma;
  dscale_shift_ref.insert(dscale_shift_ref.end(), back.dbeta.begin(), back.dbeta.end());

  const DeviceBuffer ss = to_device(scale_shift);
  for (Layout layout : layouts_for(c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(x, desc(s, layout));
    DeviceTensor yt(cpu(), desc(s, layout));
    DeviceBuffer save_mean(cpu(), c * sizeof(float));
    DeviceBuffer save_var(cpu(), c * sizeof(float));
    const DeviceBuffer running_mean = to_device(running_mean0);
    const DeviceBuffer running_var = to_device(running_var0);
    cpu().fill(yt.tensor, kNaN);
    cpu().batch_norm_forward_training(xt.tensor, yt.tensor, ss.floats(), save_mean.floats(),
                                      save_var.floats(), running_mean.floats(),
                                      running_var.floats(), momentum, eps);
    expect_close(from_device(yt.tensor), fwd.y, kSumRtol, "bn training y");
    expect_close(from_device(save_mean.floats(), c), fwd.mean, kSumRtol, "bn saved mean");
    expect_close(from_device(save_var.floats(), c), fwd.var, kSumRtol,
                 "bn saved (biased) variance");
    expect_close(from_device(running_mean.floats(), c), running_mean_ref, kSumRtol,
                 "bn running mean");
    expect_close(from_device(running_var.floats(), c), running_var_ref, kSumRtol,
                 "bn running variance (unbiased batch variance)");

    const DeviceBuffer rm0 = to_device(running_mean0);
    const DeviceBuffer rv0 = to_device(running_var0);
    DeviceTensor inf(cpu(), desc(s, layout));
    cpu().fill(inf.tensor, kNaN);
    cpu().batch_norm_forward_inference(xt.tensor, inf.tensor, ss.floats(), rm0.floats(),
                                       rv0.floats(), eps);
    expect_close(from_device(inf.tensor), inference_ref, kSumRtol, "bn inference y");

    const DeviceTensor dyt = to_device(dy, desc(s, layout));
    DeviceTensor dxt(cpu(), desc(s, layout));
    DeviceBuffer dss(cpu(), 2 * c * sizeof(float));
    cpu().fill(dxt.tensor, kNaN);
    cpu().fill(flat(dss.floats(), 2 * c), kNaN);
    cpu().batch_norm_backward(xt.tensor, dyt.tensor, ss.floats(), save_mean.floats(),
                              save_var.floats(), dxt.tensor, dss.floats(), 0.0f, eps);
    expect_close(from_device(dxt.tensor), back.dx, kSumRtol, "bn dx");
    expect_close(from_device(dss.floats(), 2 * c), dscale_shift_ref, kSumRtol, "bn d(scale_shift)");
    cpu().batch_norm_backward(xt.tensor, dyt.tensor, ss.floats(), save_mean.floats(),
                              save_var.floats(), dxt.tensor, dss.floats(), 1.0f, eps);
    expect_close(from_device(dxt.tensor), back.dx, kSumRtol, "bn dx (beta applies to dscale only)");
    expect_close(from_device(dss.floats(), 2 * c), plus(dscale_shift_ref, dscale_shift_ref),
                 kSumRtol, "bn d(scale_shift) beta=1");
  }
}

// ======================================================= add, accumulate

TEST(CpuBackend, AddInAnyLayoutsAndAliased) {
  std::mt19937 rng(16);
  const Shape s{2, 20, 5, 5};
  const Vec a = random_vec(rng, s.elements());
  const Vec b = random_vec(rng, s.elements());
  const Vec sum = reference::add(a, b);
  const Layout preferred = cpu().preferred_layout(s.c);
  for (Layout la : {Layout::kPlain, preferred}) {
    for (Layout lb : {Layout::kPlain, preferred}) {
      for (Layout ly : {Layout::kPlain, preferred}) {
        SCOPED_TRACE(std::string(layout_name(la)) + " + " + layout_name(lb) + " -> " +
                     layout_name(ly));
        const DeviceTensor at = to_device(a, desc(s, la));
        const DeviceTensor bt = to_device(b, desc(s, lb));
        DeviceTensor yt(cpu(), desc(s, ly));
        cpu().fill(yt.tensor, kNaN);
        cpu().add(at.tensor, bt.tensor, yt.tensor);
        expect_equal(from_device(yt.tensor), sum, "a + b");
      }
    }
    const DeviceTensor at = to_device(a, desc(s, la));
    const DeviceTensor bt = to_device(b, desc(s, la));
    cpu().add(at.tensor, bt.tensor, at.tensor);
    expect_equal(from_device(at.tensor), sum, "a += b (y aliases a)");
    cpu().add(at.tensor, bt.tensor, bt.tensor);
    expect_equal(from_device(bt.tensor), reference::add(sum, b), "b = a + b (y aliases b)");
  }
}

TEST(CpuBackend, AccumulateOverwritesOrAdds) {
  std::mt19937 rng(17);
  const Shape s{2, 20, 5, 5};
  const Vec x = random_vec(rng, s.elements());
  const Vec y0 = random_vec(rng, s.elements());
  for (Layout layout : layouts_for(s.c)) {
    SCOPED_TRACE(layout_name(layout));
    const DeviceTensor xt = to_device(x, desc(s, layout));
    DeviceTensor yt(cpu(), desc(s, layout));
    cpu().fill(yt.tensor, kNaN);
    cpu().accumulate(xt.tensor, yt.tensor, 0.0f);
    expect_equal(from_device(yt.tensor), x, "beta=0");
    cpu().upload(y0.data(), yt.tensor);
    cpu().accumulate(xt.tensor, yt.tensor, 1.0f);
    expect_equal(from_device(yt.tensor), reference::add(x, y0), "beta=1");
  }
}

// =============================================================== concat

TEST(CpuBackend, ConcatForwardAndBackward) {
  std::mt19937 rng(18);
  for (const std::vector<int64_t>& channels :
       {std::vector<int64_t>{8, 16, 24}, std::vector<int64_t>{3, 5}}) {
    std::vector<Shape> shapes;
    std::vector<Vec> xs;
    int64_t total = 0;
    for (int64_t c : channels) {
      shapes.push_back({2, c, 5, 5});
      xs.push_back(random_vec(rng, 2 * c * 25));
      total += c;
    }
    const Shape ys{2, total, 5, 5};
    const Vec y_ref = reference::concat(shapes, xs);
    const Vec dy = random_vec(rng, ys.elements());
    const std::vector<Vec> dxs_ref = reference::concat_backward(shapes, dy);
    // All plain; all in their preferred layouts; inputs plain into a preferred output.
    for (int mode = 0; mode < 3; ++mode) {
      const auto input_layout = [&](int64_t c) {
        return mode == 1 ? cpu().preferred_layout(c) : Layout::kPlain;
      };
      const Layout y_layout = mode == 0 ? Layout::kPlain : cpu().preferred_layout(total);
      SCOPED_TRACE("channels " + std::to_string(channels.front()) + ".. mode " +
                   std::to_string(mode));
      std::vector<DeviceTensor> inputs;
      std::vector<Tensor> views;
      for (size_t i = 0; i < shapes.size(); ++i) {
        inputs.push_back(to_device(xs[i], desc(shapes[i], input_layout(shapes[i].c))));
        views.push_back(inputs.back().tensor);
      }
      DeviceTensor yt(cpu(), desc(ys, y_layout));
      cpu().fill(yt.tensor, kNaN);
      cpu().concat_forward(views, yt.tensor);
      expect_equal(from_device(yt.tensor), y_ref, "concat y");

      // Each input takes its share with its own beta: odd inputs accumulate
      // onto previous contents, even ones overwrite NaN.
      const DeviceTensor dyt = to_device(dy, desc(ys, y_layout));
      int64_t offset = 0;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const bool accumulate = i % 2 == 1;
        const Vec previous = random_vec(rng, shapes[i].elements());
        const DeviceTensor dx = to_device(previous, desc(shapes[i], input_layout(shapes[i].c)));
        if (!accumulate) cpu().fill(dx.tensor, kNaN);
        cpu().concat_backward(dyt.tensor, offset, dx.tensor, accumulate ? 1.0f : 0.0f);
        expect_equal(from_device(dx.tensor),
                     accumulate ? reference::add(dxs_ref[i], previous) : dxs_ref[i],
                     "concat dx" + std::to_string(i) + (accumulate ? " beta=1" : " beta=0"));
        offset += shapes[i].c;
      }
    }
  }
}

// ================================================================= loss

// Loss statistics and dlogits of 16 samples over 10 classes, logits in `layout`.
void check_softmax_cross_entropy(Layout layout) {
  SCOPED_TRACE(layout_name(layout));
  std::mt19937 rng(19);
  const int64_t n = 16;
  const int64_t classes = 10;
  const float scale = 1.0f / n;
  const Vec logits = random_vec(rng, n * classes, -4.0f, 4.0f);
  // Every third sample is labelled with its arg-max so that correct is neither 0 nor n.
  std::vector<int32_t> labels(n);
  std::uniform_int_distribution<int32_t> any_class(0, classes - 1);
  for (int64_t i = 0; i < n; ++i) {
    const auto row = logits.begin() + i * classes;
    labels[i] = i % 3 == 0 ? int32_t(std::max_element(row, row + classes) - row) : any_class(rng);
  }
  const reference::SoftmaxXent ref =
      reference::softmax_cross_entropy(n, classes, logits, labels, scale);
  ASSERT_GT(ref.correct, 0);
  ASSERT_LT(ref.correct, n);

  DeviceBuffer device_labels(cpu(), n * sizeof(int32_t));
  cpu().upload_labels(labels.data(), static_cast<int32_t*>(device_labels.get()), n);
  const auto* labels_ptr = static_cast<const int32_t*>(device_labels.get());
  const DeviceTensor lt = to_device(logits, desc({n, classes, 1, 1}, layout));
  DeviceTensor dlt(cpu(), desc({n, classes, 1, 1}, layout));
  cpu().fill(dlt.tensor, kNaN);
  const LossStats stats = cpu().softmax_cross_entropy(lt.tensor, labels_ptr, scale, &dlt.tensor);
  EXPECT_NEAR(stats.loss_sum, ref.loss_sum, 1e-5 * ref.loss_sum);
  EXPECT_EQ(stats.correct, ref.correct);
  expect_close(from_device(dlt.tensor), ref.dlogits, 1e-5, "dlogits");
  // Without dlogits only the statistics are computed.
  const LossStats again = cpu().softmax_cross_entropy(lt.tensor, labels_ptr, scale, nullptr);
  EXPECT_NEAR(again.loss_sum, ref.loss_sum, 1e-5 * ref.loss_sum);
  EXPECT_EQ(again.correct, ref.correct);
}

TEST(CpuBackend, SoftmaxCrossEntropy) { check_softmax_cross_entropy(Layout::kPlain); }

// The contract lets every activation take any layout, logits included.
TEST(CpuBackend, SoftmaxCrossEntropyLogitsMustBePlain) {
  const Layout layout = cpu().preferred_layout(10);
  if (layout == Layout::kPlain) GTEST_SKIP() << "plain is preferred for 10 channels";
  DeviceTensor logits(cpu(), desc({2, 10, 1, 1}, layout));
  DeviceBuffer labels(cpu(), 2 * sizeof(int32_t));
  EXPECT_THROW(cpu().softmax_cross_entropy(logits.tensor, static_cast<const int32_t*>(labels.get()),
                                           1.0f, nullptr),
               BackendError);
}

// ============================================================ optimizer

TEST(CpuBackend, SgdTwoStepsWithMomentumAndWeightDecay) {
  std::mt19937 rng(20);
  const int64_t count = 1000;
  Vec w = random_vec(rng, count);
  Vec v(static_cast<size_t>(count), 0.0f);
  const DeviceBuffer wd = to_device(w);
  const DeviceBuffer vd = to_device(v);
  const SgdStep step{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};
  for (int i = 0; i < 2; ++i) {
    const Vec g = random_vec(rng, count);
    const DeviceBuffer gd = to_device(g);
    cpu().sgd_update(wd.floats(), gd.floats(), vd.floats(), count, step);
    reference::sgd_update(w, g, v, step);
    expect_close(from_device(vd.floats(), count), v, 1e-6,
                 "velocity after step " + std::to_string(i + 1));
    expect_close(from_device(wd.floats(), count), w, 1e-6,
                 "weights after step " + std::to_string(i + 1));
  }
}

TEST(CpuBackend, ScaleMultipliesInPlace) {
  std::mt19937 rng(21);
  const Vec x = random_vec(rng, 257);
  const DeviceBuffer xd = to_device(x);
  cpu().scale(xd.floats(), 257, 0.25f);
  Vec expected = x;
  for (float& e : expected) e *= 0.25f;
  expect_equal(from_device(xd.floats(), 257), expected, "x * 0.25");
}

// ============================================== layouts, fill, transfers

TEST(CpuBackend, ConvertRoundTripsThroughEveryLayout) {
  std::mt19937 rng(22);
  const Shape s{2, 20, 5, 5};
  const Vec x = random_vec(rng, s.elements());
  const DeviceTensor plain = to_device(x, desc(s));
  DeviceTensor b8(cpu(), desc(s, Layout::kBlocked8));
  DeviceTensor b16(cpu(), desc(s, Layout::kBlocked16));
  DeviceTensor back(cpu(), desc(s));
  cpu().convert(plain.tensor, b8.tensor);
  expect_equal(from_device(b8.tensor), x, "plain -> nChw8c");
  cpu().convert(b8.tensor, b16.tensor);
  expect_equal(from_device(b16.tensor), x, "nChw8c -> nChw16c");
  cpu().convert(b16.tensor, back.tensor);
  expect_equal(from_device(back.tensor), x, "nChw16c -> plain");
}

TEST(CpuBackend, FillSetsEveryLogicalElement) {
  const Shape s{3, 20, 4, 4};
  for (Layout layout : {Layout::kPlain, Layout::kBlocked8, Layout::kBlocked16}) {
    DeviceTensor t(cpu(), desc(s, layout));
    cpu().fill(t.tensor, 3.5f);
    expect_equal(from_device(t.tensor), Vec(static_cast<size_t>(s.elements()), 3.5f),
                 std::string("fill ") + layout_name(layout));
  }
}

TEST(CpuBackend, MemoryStreamCopiesThroughPinnedMemory) {
  std::mt19937 rng(23);
  const int64_t count = 1 << 20;  // 4 MiB: big enough that the copy takes a while
  const size_t bytes = count * sizeof(float);
  const Vec x = random_vec(rng, count);
  const DeviceBuffer source = to_device(x);
  DeviceBuffer restored(cpu(), bytes);
  PinnedBuffer pinned(cpu(), bytes);

  cpu().copy_async(pinned.get(), source.get(), bytes, StreamKind::kMemory);
  const Event offloaded = cpu().record_event(StreamKind::kMemory);
  EXPECT_EQ(offloaded.stream, StreamKind::kMemory);
  cpu().synchronize(offloaded);
  // Pinned memory is host memory: readable directly once the event has passed.
  EXPECT_EQ(std::memcmp(pinned.get(), x.data(), bytes), 0) << "device -> pinned copy differs";

  cpu().copy_async(restored.get(), pinned.get(), bytes, StreamKind::kMemory);
  const Event prefetched = cpu().record_event(StreamKind::kMemory);
  // Compute work issued after this waits for the prefetch.
  cpu().wait_event(StreamKind::kCompute, prefetched);
  cpu().synchronize(StreamKind::kMemory);
  expect_equal(from_device(restored.floats(), count), x, "device -> pinned -> device");

  // Events are ordered: a later ticket on the same stream is not earlier.
  const Event later = cpu().record_event(StreamKind::kMemory);
  EXPECT_GE(later.ticket, prefetched.ticket);
  cpu().synchronize(later);
}

// ============================================== memory accounting, misc

TEST(CpuBackendMemory, AccountingPeakAndLimit) {
  const size_t kib = 1024;
  const std::unique_ptr<Backend> b = make_backend({.kind = "cpu", .memory_limit = 1024 * kib});
  EXPECT_EQ(b->device_info().memory_bytes, 1024 * kib);
  EXPECT_EQ(b->device_bytes_in_use(), 0u);

  void* first = b->allocate_device(256 * kib);
  void* second = b->allocate_device(512 * kib);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u) << "not 64-byte aligned";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(second) % 64, 0u) << "not 64-byte aligned";
  EXPECT_EQ(b->device_bytes_in_use(), 768 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 768 * kib);

  b->free_device(first);
  EXPECT_EQ(b->device_bytes_in_use(), 512 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 768 * kib);
  b->reset_peak();
  EXPECT_EQ(b->device_bytes_peak(), 512 * kib);

  // 512 KiB in use + 600 KiB > 1 MiB; a failed request changes nothing.
  EXPECT_THROW(b->allocate_device(600 * kib), BackendError);
  EXPECT_THROW(b->allocate_device(2048 * kib), BackendError);
  EXPECT_EQ(b->device_bytes_in_use(), 512 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 512 * kib);

  // Exactly up to the limit is allowed.
  void* rest = b->allocate_device(512 * kib);
  EXPECT_EQ(b->device_bytes_in_use(), 1024 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 1024 * kib);
  b->free_device(rest);
  b->free_device(second);
  EXPECT_EQ(b->device_bytes_in_use(), 0u);
  EXPECT_EQ(b->device_bytes_peak(), 1024 * kib);
}

// Each op's scratch query covers what its calls take: with the queried bytes
// reserved (as a network does before it sizes its pool), no call grows the
// scratch, so no step allocates device memory outside the plan.
void expect_scratch_covers(const std::string& op,
                           const std::function<size_t(Backend&)>& query,
                           const std::function<void(Backend&)>& calls) {
  const std::unique_ptr<Backend> b = make_backend({.kind = "cpu"});
  const size_t bytes = query(*b);
  b->reserve_scratch(bytes);
  EXPECT_EQ(b->scratch_bytes(), bytes) << op;
  const size_t in_use = b->device_bytes_in_use();
  calls(*b);
  EXPECT_EQ(b->scratch_bytes(), bytes) << op << ": a call needed more scratch than its query said";
  EXPECT_EQ(b->device_bytes_in_use(), in_use) << op;
}

// A tensor filled with `value` on backend b.
DeviceTensor filled(Backend& b, const TensorDesc& d, float value = 0.5f) {
  DeviceTensor t(b, d);
  b.fill(t.tensor, value);
  return t;
}

TEST(CpuBackendMemory, ScratchQueriesCoverEveryOpsCalls) {
  const Layout l16 = cpu().preferred_layout(16), l50 = cpu().preferred_layout(50);
  const TensorDesc x16 = desc({2, 16, 6, 6}, l16);
  expect_scratch_covers("relu", [&](Backend& b) { return b.relu_scratch_bytes(x16); },
                        [&](Backend& b) {
                          DeviceTensor x = filled(b, x16), y = filled(b, x16);
                          b.relu_forward(x.tensor, y.tensor);
                          b.relu_backward(y.tensor, x.tensor, x.tensor);
                        });
  const PoolParams pool;
  const TensorDesc y16 = desc({2, 16, 3, 3}, l16);
  expect_scratch_covers("pooling", [&](Backend& b) { return b.pooling_scratch_bytes(pool, x16, y16); },
                        [&](Backend& b) {
                          DeviceTensor x = filled(b, x16), y = filled(b, y16), dx = filled(b, x16);
                          DeviceBuffer state(b, b.pooling_state_bytes(pool, x16, y16));
                          b.pooling_forward(pool, x.tensor, y.tensor, state.get());
                          b.pooling_backward(pool, x.tensor, y.tensor, y.tensor, dx.tensor,
                                             state.get());
                        });
  const TensorDesc x50 = desc({4, 50, 4, 4}, l50), fc = desc({4, 120, 1, 1});
  size_t ip_bytes = 0;
  expect_scratch_covers("inner product",
                        [&](Backend& b) { return ip_bytes = b.inner_product_scratch_bytes(x50, 120, true); },
                        [&](Backend& b) {
                          DeviceTensor x = filled(b, x50), y = filled(b, fc);
                          DeviceTensor w = filled(b, desc({120 * 50 * 16 + 120, 1, 1, 1}));
                          b.inner_product_forward(x.tensor, w.tensor.data, w.tensor.data, y.tensor);
                          b.inner_product_backward_data(y.tensor, w.tensor.data, x.tensor);
                          for (float beta : {0.0f, 1.0f}) {
                            b.inner_product_backward_weights(x.tensor, y.tensor, w.tensor.data,
                                                             w.tensor.data + 120 * 50 * 16, beta);
                          }
                        });
  // Blocked inputs take blocked weights: the plain user weights are reordered.
  if (l50 != Layout::kPlain) EXPECT_GT(ip_bytes, size_t{120 * 50 * 16 * sizeof(float)});
  expect_scratch_covers("batch norm", [&](Backend& b) { return b.batch_norm_scratch_bytes(x16, 1e-5f); },
                        [&](Backend& b) {
                          DeviceTensor x = filled(b, x16), y = filled(b, x16);
                          DeviceTensor p = filled(b, desc({6 * 16, 1, 1, 1}));
                          float* f = p.tensor.data;
                          b.batch_norm_forward_training(x.tensor, y.tensor, f, f + 32, f + 48,
                                                        f + 64, f + 80, 0.1f, 1e-5f);
                          b.batch_norm_forward_inference(x.tensor, y.tensor, f, f + 64, f + 80,
                                                         1e-5f);
                          for (float beta : {0.0f, 1.0f}) {
                            b.batch_norm_backward(x.tensor, y.tensor, f, f + 32, f + 48, y.tensor,
                                                  f + 64, beta, 1e-5f);
                          }
                        });
  const TensorDesc plain16 = desc(x16.shape);
  expect_scratch_covers("add",
                        [&](Backend& b) {
                          return std::max(b.add_scratch_bytes(plain16, x16, x16),
                                          b.add_scratch_bytes(x16, plain16, x16));
                        },
                        [&](Backend& b) {
                          DeviceTensor a = filled(b, plain16), y = filled(b, x16);
                          b.add(a.tensor, y.tensor, y.tensor);
                          b.accumulate(a.tensor, y.tensor, 1.0f);
                        });
  const std::vector<TensorDesc> parts{desc({2, 3, 5, 5}, cpu().preferred_layout(3)),
                                      desc({2, 13, 5, 5}, cpu().preferred_layout(13))};
  const TensorDesc cat = desc({2, 16, 5, 5}, l16);
  expect_scratch_covers("concat", [&](Backend& b) { return b.concat_scratch_bytes(parts, cat); },
                        [&](Backend& b) {
                          DeviceTensor x0 = filled(b, parts[0]), x1 = filled(b, parts[1]);
                          DeviceTensor y = filled(b, cat);
                          const std::vector<Tensor> xs{x0.tensor, x1.tensor};
                          b.concat_forward(xs, y.tensor);
                          b.concat_backward(y.tensor, 0, x0.tensor, 1.0f);
                          b.concat_backward(y.tensor, 3, x1.tensor, 0.0f);
                        });
}

TEST(CpuBackendMisc, DeviceInfoDescribesTheCpuBackend) {
  const DeviceInfo info = cpu().device_info();
  EXPECT_EQ(info.backend, "cpu");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.threads, 1);
  EXPECT_NE(info.library_version.find("oneDNN"), std::string::npos) << info.library_version;
  EXPECT_GT(info.memory_bytes, 0u);
}

TEST(CpuBackendMisc, UnknownKindThrowsNamingTheKnownOnes) {
  try {
    make_backend({.kind = "tpu"});
    FAIL() << "make_backend accepted kind \"tpu\"";
  } catch (const BackendError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tpu"), std::string::npos) << message;
    EXPECT_NE(message.find("cpu"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace vtrain::worker
