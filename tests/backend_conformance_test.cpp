// Backend conformance, part 1: every convolution algorithm of every kind
// with beta 0 and 1, relu, pooling, and each op's scratch query, on every
// backend (tests/backend_conformance.h), against tests/reference_ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/backend_conformance.h"
#include "tests/backend_conformance_cases.h"
#include "tests/backend_conformance_checks.h"
#include "tests/backend_test_support.h"
#include "tests/reference_ops.h"
#include "worker/device/backend.h"

namespace vtrain::backend_test {
namespace {

using backend_test::PrintTo;  // names the cases in gtest's output

using worker::PoolKind;
using worker::ActivationDesc;
using worker::BatchNormDesc;
using worker::BinaryDesc;
using worker::BinaryKind;
using worker::ConcatDesc;
using worker::Direction;
using worker::PoolDesc;
using worker::SoftmaxCrossEntropyDesc;
using worker::TensorDesc;

// ============================================================== convolution

std::vector<std::string> output_names(ConvKind kind) {
  switch (kind) {
    case ConvKind::kForward: return {"y"};
    case ConvKind::kBackwardData: return {"dx"};
    case ConvKind::kBackwardFilter: return {"dw", "dbias"};
  }
  return {};
}

class ConvConformance : public OnEveryBackend<ConvCase> {
 protected:
  // Every algorithm listed for `op` in every layout pair, with beta = 0
  // (the algorithms and workspaces listed without accumulation) and beta = 1
  // (those listed with it): each reports the workspace scratch_bytes() of its descriptor says
  // and its name, and computes reference + beta * previous contents. A
  // backend other than the CPU also matches the CPU backend's result.
  void check_every_algorithm(ConvKind op) {
    Backend& b = backend();
    const ConvData d(conv_problem(param()));
    const std::vector<Vec> reference = d.reference_of(op);
    const std::vector<std::string> names = output_names(op);
    std::mt19937 rng(5);
    std::vector<Vec> previous;
    for (const Vec& r : reference) previous.push_back(random_vec(rng, int64_t(r.size())));
    for (const auto& [x_layout, y_layout] : conv_layouts(b, param())) {
      const ConvProblem p = conv_problem(param(), x_layout, y_layout);
      SCOPED_TRACE(p.str());
      for (const bool accumulate : {false, true}) {
        const float beta = accumulate ? 1.0f : 0.0f;
        const std::vector<ConvAlgoInfo> algos = conv_algorithms(b, op, p, accumulate);
        ASSERT_FALSE(algos.empty()) << conv_kind_name(op) << " lists no algorithm";
        std::vector<Vec> on_cpu;
        if (base_kind(kind()) != "cpu") {
          Backend& cpu = shared_backend("cpu");
          on_cpu = run_conv(cpu, op, conv_algorithms(cpu, op, p, accumulate).front(), p, d,
                            beta, previous);
        }
        for (const ConvAlgoInfo& info : algos) {
          const std::string what = std::string(conv_kind_name(op)) + "/" + info.name +
                                   " beta=" + std::to_string(int(beta));
          EXPECT_EQ(info.name, b.conv_algorithm_name(op, info.algo)) << what;
          EXPECT_EQ(info.workspace_bytes, conv_workspace(b, op, info.algo, p, accumulate)) << what;
          const double rtol = tolerance().conv(info.name, p);
          const std::vector<Vec> got = run_conv(b, op, info, p, d, beta, previous);
          for (size_t i = 0; i < reference.size(); ++i) {
            expect_close(got[i], accumulate ? plus(reference[i], previous[i]) : reference[i],
                         rtol, what + " " + names[i]);
            if (!on_cpu.empty())
              expect_close(got[i], on_cpu[i], rtol, what + " " + names[i] + " vs cpu");
          }
        }
      }
    }
  }
};

TEST_P(ConvConformance, ForwardEveryAlgorithmBothBetas) {
  check_every_algorithm(ConvKind::kForward);
}
TEST_P(ConvConformance, BackwardDataEveryAlgorithmBothBetas) {
  check_every_algorithm(ConvKind::kBackwardData);
}
TEST_P(ConvConformance, BackwardFilterEveryAlgorithmBothBetas) {
  check_every_algorithm(ConvKind::kBackwardFilter);
}

// A null bias (forward) and a null dbias (backward filter) are legal.
TEST_P(ConvConformance, WithoutBiasOrDbias) {
  Backend& b = backend();
  const ConvData d(conv_problem(param()));
  const ConvProblem& p = d.p;
  const Vec y_ref = reference::conv_forward(p, d.x, d.w, {});
  const DeviceTensor x = to_device(b, d.x, p.x);
  const DeviceTensor dy = to_device(b, d.dy, p.y);
  const DeviceBuffer w = to_device(b, d.w);
  for (const ConvAlgoInfo& info : conv_algorithms(b, ConvKind::kForward, p, false)) {
    DeviceBuffer ws(b, info.workspace_bytes);
    DeviceTensor y(b, p.y);
    b.fill(y.tensor, kNaN);
    conv_forward(b, info.algo, p, x.tensor, w.floats(), nullptr, y.tensor, 0.0f, ws.get(),
                   info.workspace_bytes);
    expect_close(from_device(b, y.tensor), y_ref, tolerance().conv(info.name, p),
                 "Forward/" + info.name + " no bias");
  }
  for (const ConvAlgoInfo& info : conv_algorithms(b, ConvKind::kBackwardFilter, p, false)) {
    DeviceBuffer ws(b, info.workspace_bytes);
    DeviceBuffer dw(b, d.dw_ref.size() * sizeof(float));
    b.fill(flat(dw.floats(), int64_t(d.dw_ref.size())), kNaN);
    conv_backward_filter(b, info.algo, p, x.tensor, dy.tensor, dw.floats(), nullptr, 0.0f, ws.get(),
                           info.workspace_bytes);
    expect_close(from_device(b, dw.floats(), int64_t(d.dw_ref.size())), d.dw_ref,
                 tolerance().conv(info.name, p), "BackwardFilter/" + info.name + " no dbias");
  }
}

VTRAIN_ON_EVERY_BACKEND(ConvConformance, kConvCases);

// ================================================================ relu

class ReluConformance : public OnEveryBackend<ReluCase> {};

TEST_P(ReluConformance, ForwardAndBackwardExact) {
  check_relu(backend(), param(), DataType::kF32);
}

VTRAIN_ON_EVERY_BACKEND(ReluConformance, kReluCases);

// ============================================================== pooling

class PoolConformance : public OnEveryBackend<PoolCase> {};

TEST_P(PoolConformance, ForwardAndBackward) {
  check_pooling(backend(), param(), DataType::kF32, tolerance().exact_max_pooling,
                tolerance().pooling_forward, tolerance().pooling_backward);
}

VTRAIN_ON_EVERY_BACKEND(PoolConformance, pool_cases());

// ================================================================ op scratch

// Each op's scratch query covers what its calls take: with the queried bytes
// reserved (as a network does before it sizes its pool), no call grows the
// scratch, so no step allocates device memory outside the plan. Each case
// runs on a backend of its own, so that its scratch starts empty. A case
// is its descriptors (what the backend is asked about) and the calls they
// describe; a descriptor the backend does not support (Backend::supports)
// skips the case with the backend's reason.
struct ScratchCase {
  const char* name;
  std::vector<worker::OpDesc> (*ops)(Backend&);
  void (*calls)(Backend&);
};

TensorDesc x16(Backend& b) { return desc({2, 16, 6, 6}, b.preferred_layout(16)); }
TensorDesc y16(Backend& b) { return desc({2, 16, 3, 3}, b.preferred_layout(16)); }
TensorDesc x50(Backend& b) { return desc({4, 50, 4, 4}, b.preferred_layout(50)); }
std::vector<TensorDesc> concat_parts(Backend& b) {
  return {desc({2, 3, 5, 5}, b.preferred_layout(3)), desc({2, 13, 5, 5}, b.preferred_layout(13))};
}
TensorDesc concat_out(Backend& b) { return desc({2, 16, 5, 5}, b.preferred_layout(16)); }
const PoolDesc kScratchPool;
using Ops = std::vector<worker::OpDesc>;
constexpr int64_t kFcOut = 120;
constexpr int64_t kFcWeights = kFcOut * 50 * 16;
// The inner product of x onto kFcOut outputs, with a bias.
worker::InnerProductDesc fc_desc(const TensorDesc& x) {
  return {worker::InnerProductKind::kForward, x, desc({x.shape.n, kFcOut, 1, 1}), true};
}

const ScratchCase kScratchCases[] = {
    {"relu", [](Backend& b) -> Ops { return {ActivationDesc{.x = x16(b), .y = x16(b)}}; },
     [](Backend& b) {
       DeviceTensor x = filled(b, x16(b)), y = filled(b, x16(b));
       relu_forward(b, x.tensor, y.tensor);
       relu_backward(b, y.tensor, x.tensor, x.tensor);
     }},
    {"pooling",
     [](Backend& b) -> Ops {
       return {PoolDesc{kScratchPool.kind, Direction::kForward, x16(b), y16(b), kScratchPool.window}};
     },
     [](Backend& b) {
       DeviceTensor x = filled(b, x16(b)), y = filled(b, y16(b)), dx = filled(b, x16(b));
       DeviceBuffer state(b, pooling_state_bytes(b, kScratchPool, x16(b), y16(b)));
       pooling_forward(b, kScratchPool, x.tensor, y.tensor, state.get());
       pooling_backward(b, kScratchPool, x.tensor, y.tensor, y.tensor, dx.tensor, state.get());
     }},
    {"inner_product", [](Backend& b) -> Ops { return {fc_desc(x50(b))}; },
     [](Backend& b) {
       DeviceTensor x = filled(b, x50(b)), y = filled(b, desc({4, kFcOut, 1, 1}));
       DeviceTensor w = filled(b, desc({kFcWeights + kFcOut, 1, 1, 1}));
       inner_product_forward(b, x.tensor, w.tensor.data, w.tensor.data, y.tensor);
       inner_product_backward_data(b, y.tensor, w.tensor.data, x.tensor);
       for (float beta : {0.0f, 1.0f}) {
         float* dw = w.tensor.f32("test");
         inner_product_backward_weights(b, x.tensor, y.tensor, dw, dw + kFcWeights, beta);
       }
       // Blocked inputs take blocked weights: the plain user weights are
       // reordered. A channels-last input is either read through a plain
       // copy (CUDA) or met by reordered weights (oneDNN): the scratch holds
       // at least the copy.
       const TensorDesc in = x50(b);
       if (in.layout == Layout::kBlocked8 || in.layout == Layout::kBlocked16) {
         EXPECT_GT(b.scratch_bytes(fc_desc(in)).scratch,
                   size_t(kFcWeights) * sizeof(float));
       } else if (in.layout == Layout::kNhwc) {
         EXPECT_GE(b.scratch_bytes(fc_desc(in)).scratch,
                   size_t(TensorDesc{in.shape, Layout::kPlain, in.dtype}.bytes()));
       }
     }},
    {"batch_norm", [](Backend& b) -> Ops { return {BatchNormDesc{.x = x16(b), .eps = 1e-5f}}; },
     [](Backend& b) {
       DeviceTensor x = filled(b, x16(b)), y = filled(b, x16(b));
       DeviceTensor p = filled(b, desc({6 * 16, 1, 1, 1}));
       float* f = p.tensor.f32("test");
       batch_norm_forward_training(b, x.tensor, y.tensor, f, f + 32, f + 48, f + 64, f + 80, 0.1f,
                                     1e-5f);
       batch_norm_forward_inference(b, x.tensor, y.tensor, f, f + 64, f + 80, 1e-5f);
       for (float beta : {0.0f, 1.0f}) {
         batch_norm_backward(b, x.tensor, y.tensor, f, f + 32, f + 48, y.tensor, f + 64, beta,
                               1e-5f);
       }
     }},
    {"add_and_accumulate",
     [](Backend& b) -> Ops {
       const TensorDesc plain16 = desc(x16(b).shape);
       return {BinaryDesc{BinaryKind::kAdd, plain16, x16(b), x16(b)},
               BinaryDesc{BinaryKind::kAccumulate, plain16, x16(b), x16(b), 1.0f}};
     },
     [](Backend& b) {
       DeviceTensor a = filled(b, desc(x16(b).shape)), y = filled(b, x16(b));
       add(b, a.tensor, y.tensor, y.tensor);
       accumulate(b, a.tensor, y.tensor, 1.0f);
     }},
    {"concat", [](Backend& b) -> Ops { return {ConcatDesc{.xs = concat_parts(b), .y = concat_out(b)}}; },
     [](Backend& b) {
       const std::vector<TensorDesc> parts = concat_parts(b);
       DeviceTensor x0 = filled(b, parts[0]), x1 = filled(b, parts[1]);
       DeviceTensor y = filled(b, concat_out(b));
       const std::vector<Tensor> xs{x0.tensor, x1.tensor};
       concat_forward(b, xs, y.tensor);
       concat_backward(b, y.tensor, 0, x0.tensor, 1.0f);
       concat_backward(b, y.tensor, 3, x1.tensor, 0.0f);
     }},
    {"softmax_cross_entropy",
     [](Backend& b) -> Ops { return {SoftmaxCrossEntropyDesc{desc({4, 10, 1, 1})}}; },
     [](Backend& b) {
       DeviceTensor logits = filled(b, desc({4, 10, 1, 1})), dlogits = filled(b, desc({4, 10, 1, 1}));
       const std::vector<int32_t> labels{0, 3, 9, 5};
       DeviceBuffer device_labels(b, labels.size() * sizeof(int32_t));
       auto* l = static_cast<int32_t*>(device_labels.get());
       b.upload_labels(labels.data(), l, 4);
       softmax_cross_entropy(b, logits.tensor, l, 0.25f, &dlogits.tensor);
       softmax_cross_entropy(b, logits.tensor, l, 0.25f, nullptr);
     }},
};

class ScratchConformance : public OnEveryBackend<ScratchCase> {};

TEST_P(ScratchConformance, QueryCoversEveryCall) {
  const std::unique_ptr<Backend> b = worker::make_backend(suite_options(kind()));
  size_t bytes = 0;
  for (const worker::OpDesc& op : param().ops(*b)) {
    if (const std::optional<std::string> why = b->supports(op)) {
      GTEST_SKIP() << "backend " << kind() << ": " << *why;
    }
    bytes = std::max(bytes, b->scratch_bytes(op).scratch);
  }
  b->reserve_scratch(bytes);
  EXPECT_EQ(b->scratch_reserved(), bytes) << param().name;
  const size_t in_use = b->device_bytes_in_use();
  param().calls(*b);
  EXPECT_EQ(b->scratch_reserved(), bytes)
      << param().name << ": a call needed more scratch than its query said";
  EXPECT_EQ(b->device_bytes_in_use(), in_use) << param().name;
}

VTRAIN_ON_EVERY_BACKEND(ScratchConformance, kScratchCases);

}  // namespace
}  // namespace vtrain::backend_test
