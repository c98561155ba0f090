// The activations of issue 43 (ActivationDesc kinds silu, gelu, sigmoid,
// relu6) on every backend built that runs them, plain and in its preferred
// layout: forward against published values and identities, backward
// against central differences of the backend's own forward, dx aliasing dy.
// (The full conformance suite's cases, against tests/reference_ops.h's
// double formulas, join once that suite is on the descriptors too.)
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "worker/device/backend.h"

namespace vtrain::worker {
namespace {

using Vec = std::vector<float>;

// A device tensor that frees itself.
class DeviceTensor {
 public:
  DeviceTensor(Backend& b, const TensorDesc& desc)
      : b_(b), tensor_{desc, b.allocate_device(desc.bytes())} {}
  ~DeviceTensor() { b_.free_device(tensor_.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  const Tensor& get() const { return tensor_; }

 private:
  Backend& b_;
  Tensor tensor_;
};

class ActivationOps : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
  }

  // y = act(x) on the device, x given plain; y returned plain.
  Vec forward(ActivationKind kind, const TensorDesc& desc, const Vec& x) {
    DeviceTensor xt(*backend_, desc), yt(*backend_, desc);
    backend_->upload(x.data(), xt.get());
    backend_->fill(yt.get(), NAN);
    backend_->run(ActivationDesc{.kind = kind, .x = desc, .y = desc},
                  ActivationArgs{.x = xt.get().data, .y = yt.get().data});
    return download(yt.get());
  }

  // dx = dy * act'(x); with `alias` written over dy.
  Vec backward(ActivationKind kind, const TensorDesc& desc, const Vec& x, const Vec& dy,
               bool alias) {
    DeviceTensor xt(*backend_, desc), dyt(*backend_, desc), dxt(*backend_, desc);
    backend_->upload(x.data(), xt.get());
    backend_->upload(dy.data(), dyt.get());
    backend_->fill(dxt.get(), NAN);
    const Tensor& dx = alias ? dyt.get() : dxt.get();
    backend_->run(ActivationDesc{.kind = kind, .direction = Direction::kBackward, .x = desc, .dy = desc, .dx = desc},
                  ActivationArgs{.x = xt.get().data, .dy = dyt.get().data, .dx = dx.data});
    return download(dx);
  }

  Vec download(const Tensor& t) {
    Vec host(static_cast<size_t>(t.desc.shape.elements()));
    backend_->download(t, host.data());
    return host;
  }

  std::vector<TensorDesc> descs(const Shape& shape) {
    std::vector<TensorDesc> out = {{shape, Layout::kPlain, DataType::kF32}};
    const Layout preferred = backend_->preferred_layout(shape.c);
    if (preferred != Layout::kPlain) out.push_back({shape, preferred, DataType::kF32});
    return out;
  }

  std::unique_ptr<Backend> backend_;
};

constexpr ActivationKind kKinds[] = {ActivationKind::kSilu, ActivationKind::kGelu,
                                     ActivationKind::kSigmoid, ActivationKind::kRelu6};

TEST_F(ActivationOps, ForwardMatchesPublishedValues) {
  // One sample, one channel of 8: x and the values of each function there.
  const Shape shape{1, 1, 1, 8};
  const Vec x = {-2.0f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f, 3.5f, 7.0f};
  struct Expected {
    ActivationKind kind;
    std::vector<double> y;
  };
  // sigmoid(1) = 0.7310585786, Phi(1) = 0.8413447461, Phi(2) = 0.9772498681.
  const Expected table[] = {
      {ActivationKind::kSigmoid,
       {0.1192029220, 0.2689414214, 0.5, 0.6224593312, 0.7310585786, 0.8807970780, 0.9706877692,
        0.9990889488}},
      {ActivationKind::kSilu,
       {-0.2384058440, -0.2689414214, 0.0, 0.3112296656, 0.7310585786, 1.7615941560, 3.3974071923,
        6.9936226416}},
      {ActivationKind::kGelu,
       {-0.0455002639, -0.1586552539, 0.0, 0.3457312306, 0.8413447461, 1.9544997361, 3.4991857982,
        7.0}},
      {ActivationKind::kRelu6, {0, 0, 0, 0.5, 1, 2, 3.5, 6}},
  };
  for (const TensorDesc& desc : descs(shape)) {
    for (const Expected& e : table) {
      SCOPED_TRACE(std::string(activation_name(e.kind)) + " " + layout_name(desc.layout));
      const Vec y = forward(e.kind, desc, x);
      for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], e.y[i], 2e-6) << "x = " << x[i];
    }
  }
}

// Values spread over [-5, 8), none within 0.05 of relu6's kinks at 0 and 6.
Vec spread(int64_t count) {
  Vec x(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    float v = -5.0f + 13.0f * static_cast<float>((i * 37) % count) / static_cast<float>(count);
    if (std::fabs(v) < 0.05f || std::fabs(v - 6.0f) < 0.05f) v += 0.1f;
    x[static_cast<size_t>(i)] = v;
  }
  return x;
}

TEST_F(ActivationOps, BackwardIsTheCentralDifferenceOfForward) {
  // 16 channels: the CPU's blocked layout keeps whole blocks of 8.
  const Shape shape{2, 16, 3, 5};
  const Vec x = spread(shape.elements());
  Vec dy(x.size());
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 0.5f - static_cast<float>(i % 7) / 7.0f;
  constexpr float kStep = 1e-2f;
  Vec up = x, down = x;
  for (float& v : up) v += kStep;
  for (float& v : down) v -= kStep;
  for (const TensorDesc& desc : descs(shape)) {
    for (ActivationKind kind : kKinds) {
      SCOPED_TRACE(std::string(activation_name(kind)) + " " + layout_name(desc.layout));
      const Vec f_up = forward(kind, desc, up), f_down = forward(kind, desc, down);
      const Vec dx = backward(kind, desc, x, dy, false);
      int failures = 0;
      for (size_t i = 0; i < x.size() && failures < 5; ++i) {
        const double numeric = dy[i] * (double(f_up[i]) - f_down[i]) / (2.0 * kStep);
        if (std::fabs(dx[i] - numeric) > 1e-3) {
          ++failures;
          ADD_FAILURE() << "x = " << x[i] << ": dx " << dx[i] << ", numeric " << numeric;
        }
      }
      EXPECT_EQ(backward(kind, desc, x, dy, true), dx) << "dx written over dy";
    }
  }
}

TEST_F(ActivationOps, SiluIsXTimesSigmoid) {
  const Shape shape{1, 16, 2, 3};
  const Vec x = spread(shape.elements());
  for (const TensorDesc& desc : descs(shape)) {
    const Vec silu = forward(ActivationKind::kSilu, desc, x);
    const Vec sigmoid = forward(ActivationKind::kSigmoid, desc, x);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(silu[i], x[i] * sigmoid[i], 1e-5) << x[i];
  }
}

TEST_F(ActivationOps, ABiasPairsWithReluOnly) {
  const TensorDesc desc{{1, 4, 2, 2}, Layout::kPlain, DataType::kF32};
  DeviceTensor xt(*backend_, desc), yt(*backend_, desc);
  const std::vector<float> bias(4, 0.0f);
  try {
    backend_->run(ActivationDesc{.kind = ActivationKind::kSilu, .x = desc, .y = desc, .bias = true},
                  ActivationArgs{.x = xt.get().data, .y = yt.get().data, .bias = bias.data()});
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_STREQ(e.what(), "silu forward (bias): a bias pairs with relu only");
  }
}

}  // namespace
}  // namespace vtrain::worker
