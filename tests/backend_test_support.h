// What the backend tests share: device memory owned by a test, transfers of
// plain host vectors through the Backend interface, random data, comparisons
// that report the worst element, and the convolution cases with their
// reference results. Used by backend_conformance_test (every op on every
// backend), cpu_backend_test and cuda_backend_test.
//
// Outputs written with beta = 0 are first filled with NaN by the tests: memory
// from the pool holds whatever the previous user left, so beta = 0 must not
// read it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/reference_ops.h"
#include "worker/device/backend.h"
#include "worker/device/op_calls.h"

// The ops the tests call with tensors beyond op_calls.h's, each one
// descriptor and run() (found by argument-dependent lookup).
namespace vtrain::worker {

inline void pooling_forward(Backend& b, const PoolDesc& p, const Tensor& x, const Tensor& y,
                            void* state) {
  b.run(PoolDesc{p.kind, Direction::kForward, x.desc, y.desc, p.window},
        PoolArgs{.x = x.data, .y = y.data, .state = state});
}
inline void pooling_backward(Backend& b, const PoolDesc& p, const Tensor& x, const Tensor& y,
                             const Tensor& dy, const Tensor& dx, const void* state) {
  b.run(PoolDesc{p.kind, Direction::kBackward, x.desc, y.desc, p.window, dy.desc, dx.desc},
        PoolArgs{.x = x.data, .y = y.data, .dy = dy.data, .dx = dx.data,
                 .state = const_cast<void*>(state)});
}
inline size_t pooling_state_bytes(Backend& b, const PoolDesc& p, const TensorDesc& x,
                                  const TensorDesc& y) {
  return b.scratch_bytes(PoolDesc{p.kind, Direction::kForward, x, y, p.window}).state;
}
inline size_t conv_workspace(Backend& b, ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                             bool accumulate) {
  return b.scratch_bytes(ConvDesc{kind, p, algo, accumulate ? 1.0f : 0.0f}).scratch;
}
inline void batch_norm_forward_training(Backend& b, const Tensor& x, const Tensor& y,
                                        const float* scale_shift, float* save_mean,
                                        float* save_var, float* running_mean, float* running_var,
                                        float momentum, float eps) {
  b.run(BatchNormDesc{BatchNormKind::kForwardTraining, x.desc, eps, momentum, 0.0f, y.desc},
        BatchNormArgs{.x = x.data, .y = y.data, .scale_shift = scale_shift, .mean = save_mean,
                      .var = save_var, .running_mean = running_mean, .running_var = running_var});
}
inline void batch_norm_forward_inference(Backend& b, const Tensor& x, const Tensor& y,
                                         const float* scale_shift, const float* mean,
                                         const float* var, float eps) {
  b.run(BatchNormDesc{BatchNormKind::kForwardInference, x.desc, eps, 0.0f, 0.0f, y.desc},
        BatchNormArgs{.x = x.data, .y = y.data, .scale_shift = scale_shift,
                      .mean = const_cast<float*>(mean), .var = const_cast<float*>(var)});
}
inline void batch_norm_backward(Backend& b, const Tensor& x, const Tensor& dy,
                                const float* scale_shift, const float* mean, const float* var,
                                const Tensor& dx, float* dscale_shift, float beta, float eps) {
  b.run(BatchNormDesc{BatchNormKind::kBackward, x.desc, eps, 0.0f, beta, {}, dy.desc, dx.desc},
        BatchNormArgs{.x = x.data, .dy = dy.data, .dx = dx.data, .scale_shift = scale_shift,
                      .mean = const_cast<float*>(mean), .var = const_cast<float*>(var),
                      .dscale_shift = dscale_shift});
}
inline std::vector<double> batch_norm_sums(Backend& b, const Tensor& x) {
  std::vector<double> sums;
  b.run(BatchNormDesc{BatchNormKind::kSums, x.desc}, BatchNormArgs{.x = x.data, .sums = &sums});
  return sums;
}
inline std::vector<double> batch_norm_backward_sums(Backend& b, const Tensor& x, const Tensor& dy,
                                                    const float* mean, const float* var,
                                                    float eps) {
  std::vector<double> sums;
  b.run(BatchNormDesc{BatchNormKind::kBackwardSums, x.desc, eps, 0.0f, 0.0f, {}, dy.desc},
        BatchNormArgs{.x = x.data, .dy = dy.data, .mean = const_cast<float*>(mean),
                      .var = const_cast<float*>(var), .sums = &sums});
  return sums;
}
inline void batch_norm_backward_data(Backend& b, const Tensor& x, const Tensor& dy,
                                     const float* scale_shift, const float* mean,
                                     const float* var, const float* dy_means, const Tensor& dx,
                                     float eps) {
  b.run(BatchNormDesc{BatchNormKind::kBackwardData, x.desc, eps, 0.0f, 0.0f, {}, dy.desc, dx.desc},
        BatchNormArgs{.x = x.data, .dy = dy.data, .dx = dx.data, .scale_shift = scale_shift,
                      .mean = const_cast<float*>(mean), .var = const_cast<float*>(var),
                      .dy_means = dy_means});
}
inline void sgd_update(Backend& b, float* w, const float* g, float* velocity, int64_t count,
                       const SgdStep& step) {
  b.run(SgdDesc{count, step}, SgdArgs{w, g, velocity});
}
inline void adamw_update(Backend& b, float* w, const float* g, float* m, float* v, int64_t count,
                         const AdamWStep& step) {
  b.run(AdamWDesc{count, step}, AdamWArgs{w, g, m, v});
}
inline void moving_average(Backend& b, float* average, const float* x, int64_t count,
                           float decay) {
  b.run(MovingAverageDesc{count, decay}, MovingAverageArgs{average, x});
}
inline void scale(Backend& b, float* x, int64_t count, float alpha) {
  b.run(ScaleDesc{count, alpha}, ScaleArgs{x});
}

}  // namespace vtrain::worker

namespace vtrain::backend_test {

using reference::Vec;
using reference::rounded;
using worker::Backend;
using worker::ConvAlgoInfo;
using worker::ConvKind;
using worker::ConvProblem;
using worker::DataType;
using worker::Layout;
using worker::Shape;
using worker::Tensor;
using worker::TensorDesc;

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Convolution, inner product and batch norm: float sums of up to a few
// thousand terms against a double reference.
inline constexpr double kSumRtol = 1e-4;

inline constexpr ConvKind kConvKinds[] = {ConvKind::kForward, ConvKind::kBackwardData,
                                          ConvKind::kBackwardFilter};

// ------------------------------------------------------------ memory

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

// A tensor together with the device memory behind it.
struct DeviceTensor {
  DeviceTensor(Backend& backend, const TensorDesc& desc)
      : memory(backend, desc.bytes()), tensor{desc, memory.floats()} {}
  DeviceBuffer memory;
  Tensor tensor;
};

inline TensorDesc desc(Shape shape, Layout layout = Layout::kPlain,
                       DataType type = DataType::kF32) {
  return TensorDesc{.shape = shape, .layout = layout, .dtype = type};
}

// A plain view of `count` floats, for parameter arrays (weights, statistics)
// that the ops take as raw pointers.
inline Tensor flat(float* data, int64_t count) { return Tensor{desc({1, count, 1, 1}), data}; }

inline DeviceTensor to_device(Backend& b, const Vec& host, const TensorDesc& d) {
  EXPECT_EQ(static_cast<int64_t>(host.size()), d.shape.elements());
  DeviceTensor t(b, d);
  b.upload(host.data(), t.tensor);
  return t;
}

// A parameter array (weights, biases) on b in `type`, rounded from host's
// floats by the upload.
inline DeviceBuffer to_device(Backend& b, const Vec& host, DataType type = DataType::kF32) {
  const auto count = static_cast<int64_t>(host.size());
  DeviceBuffer buffer(b, host.size() * worker::element_bytes(type));
  const Tensor view{desc({1, count, 1, 1}, Layout::kPlain, type), buffer.get()};
  if (count > 0) b.upload(host.data(), view);
  return buffer;
}

inline Vec from_device(Backend& b, const Tensor& t) {
  Vec host(static_cast<size_t>(t.shape().elements()));
  b.download(t, host.data());
  return host;
}

inline Vec from_device(Backend& b, const float* data, int64_t count) {
  Vec host(static_cast<size_t>(count));
  b.download(flat(const_cast<float*>(data), count), host.data());
  return host;
}

// A tensor of `d` on b with every element `value`.
inline DeviceTensor filled(Backend& b, const TensorDesc& d, float value = 0.5f) {
  DeviceTensor t(b, d);
  b.fill(t.tensor, value);
  return t;
}

// ------------------------------------------------------------ data

inline Vec random_vec(std::mt19937& rng, int64_t count, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(static_cast<size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

inline Vec plus(const Vec& a, const Vec& b) { return reference::add(a, b); }

// Plain, then b's preferred layout for this channel count if it differs:
// every op must accept both.
inline std::vector<Layout> layouts_for(Backend& b, int64_t channels) {
  std::vector<Layout> layouts = {Layout::kPlain};
  if (b.preferred_layout(channels) != Layout::kPlain) layouts.push_back(b.preferred_layout(channels));
  return layouts;
}

// ------------------------------------------------------------ comparisons

// Elementwise |actual - expected| <= rtol * (|expected| + largest |expected|):
// a sum with cancellation carries an absolute error proportional to its terms,
// not to its result, so small outputs of large sums get the scale of the
// tensor. Reports the count, the worst element and the first few mismatches.
inline void expect_close(const Vec& actual, const Vec& expected, double rtol,
                         const std::string& what) {
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

inline void expect_equal(const Vec& actual, const Vec& expected, const std::string& what) {
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

// Names a test case (any struct with a `name`) in gtest's output instead of
// dumping its bytes. Case structs of other namespaces take it in with
// `using backend_test::PrintTo;` next to them, where gtest's lookup finds it.
template <typename Case>
  requires requires(const Case& c) { std::string(c.name); }
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// ------------------------------------------------------------ convolution

struct ConvCase {
  const char* name;
  int64_t c, h, w;  // input channels and size
  int64_t k, r;     // output channels, square filter size
  int64_t pad, stride;
  int64_t n;  // batch
  int64_t groups = 1;
};


inline ConvProblem conv_problem(const ConvCase& cc, Layout x_layout = Layout::kPlain,
                                Layout y_layout = Layout::kPlain, DataType type = DataType::kF32) {
  ConvProblem p{.x = desc({cc.n, cc.c, cc.h, cc.w}, x_layout, type),
                .y = {},
                .k = cc.k,
                .window = {cc.r, cc.r, cc.stride, cc.stride, cc.pad, cc.pad},
                .groups = cc.groups};
  p.y = desc(p.output_shape(), y_layout, type);
  return p;
}

// Activation layout pairs (x, y) for a case on b: both plain, both
// preferred, and mixed.
inline std::vector<std::pair<Layout, Layout>> conv_layouts(Backend& b, const ConvCase& cc) {
  const Layout px = b.preferred_layout(cc.c);
  const Layout py = b.preferred_layout(cc.k);
  std::vector<std::pair<Layout, Layout>> pairs = {{Layout::kPlain, Layout::kPlain}};
  for (auto pair :
       {std::pair{px, py}, std::pair{Layout::kPlain, py}, std::pair{px, Layout::kPlain}})
    if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) pairs.push_back(pair);
  return pairs;
}

// Host data and reference results of one convolution problem, in the
// problem's element type (reference_ops.h): the data rounded to it, y and dx
// too, dw and dbias (always f32) not.
struct ConvData {
  explicit ConvData(const ConvProblem& problem) : p(problem) {
    std::mt19937 rng(static_cast<unsigned>(p.x.shape.c * 1000 + p.k * 10 + p.x.shape.n));
    const DataType type = p.x.dtype;
    x = rounded(type, random_vec(rng, p.x.shape.elements()));
    w = rounded(type, random_vec(rng, p.weight_shape().elements()));
    bias = rounded(type, random_vec(rng, p.k));
    dy = rounded(type, random_vec(rng, p.y.shape.elements()));
    y_ref = rounded(type, reference::conv_forward(p, x, w, bias));
    dx_ref = rounded(type, reference::conv_backward_data(p, dy, w));
    dw_ref = reference::conv_backward_filter(p, x, dy, &dbias_ref);
  }
  ConvProblem p;
  Vec x, w, bias, dy;
  Vec y_ref, dx_ref, dw_ref, dbias_ref;

  // The reference outputs of one kind: {y}, {dx} or {dw, dbias}.
  std::vector<Vec> reference_of(ConvKind kind) const {
    switch (kind) {
      case ConvKind::kForward: return {y_ref};
      case ConvKind::kBackwardData: return {dx_ref};
      case ConvKind::kBackwardFilter: return {dw_ref, dbias_ref};
    }
    return {};
  }
};

// The outputs of one kind with one algorithm and beta on `b` for problem p
// (d's data, p's layouts and element type: w and bias in it too), starting
// from `previous` outputs (NaN where beta = 0): {y} or {dx} or {dw, dbias}.
inline std::vector<Vec> run_conv(Backend& b, ConvKind kind, const ConvAlgoInfo& info,
                                 const ConvProblem& p, const ConvData& d, float beta,
                                 const std::vector<Vec>& previous) {
  DeviceBuffer workspace(b, info.workspace_bytes);
  const DeviceBuffer w = to_device(b, d.w, p.x.dtype);
  auto start = [&](const Vec& v) { return beta == 0.0f ? Vec(v.size(), kNaN) : v; };
  switch (kind) {
    case ConvKind::kForward: {
      const DeviceTensor x = to_device(b, d.x, p.x);
      const DeviceBuffer bias = to_device(b, d.bias, p.x.dtype);
      const DeviceTensor y = to_device(b, start(previous[0]), p.y);
      conv_forward(b, info.algo, p, x.tensor, w.get(), bias.get(), y.tensor, beta,
                     workspace.get(), info.workspace_bytes);
      return {from_device(b, y.tensor)};
    }
    case ConvKind::kBackwardData: {
      const DeviceTensor dy = to_device(b, d.dy, p.y);
      const DeviceTensor dx = to_device(b, start(previous[0]), p.x);
      conv_backward_data(b, info.algo, p, dy.tensor, w.get(), dx.tensor, beta, workspace.get(),
                           info.workspace_bytes);
      return {from_device(b, dx.tensor)};
    }
    case ConvKind::kBackwardFilter: {
      const DeviceTensor x = to_device(b, d.x, p.x);
      const DeviceTensor dy = to_device(b, d.dy, p.y);
      const DeviceBuffer dw = to_device(b, start(previous[0]));
      const DeviceBuffer db = to_device(b, start(previous[1]));
      conv_backward_filter(b, info.algo, p, x.tensor, dy.tensor, dw.floats(), db.floats(), beta,
                             workspace.get(), info.workspace_bytes);
      return {from_device(b, dw.floats(), p.weight_shape().elements()),
              from_device(b, db.floats(), p.k)};
    }
  }
  return {};
}

}  // namespace vtrain::backend_test
