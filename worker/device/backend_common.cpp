// Backend-independent helpers declared in worker/device/backend.h, ops.h
// and op_table.h.
#include "worker/device/backend.h"

#include <cmath>
#include <variant>

#include "worker/device/op_table.h"

namespace vtrain::worker {

AdamWFactors adamw_factors(const AdamWStep& step) {
  const double lr = step.lr;
  const double t = static_cast<double>(step.step);
  return {static_cast<float>(1.0 - lr * step.weight_decay),
          static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(step.beta1), t))),
          static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(step.beta2), t)))};
}

Shape Window::output_shape(const Shape& x, int64_t channels) const {
  const auto along = [](int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
    return (in + 2 * pad - kernel) / stride + 1;
  };
  return {x.n, channels, along(x.h, kernel_h, stride_h, pad_h), along(x.w, kernel_w, stride_w, pad_w)};
}

ConvProblem ConvProblem::with_batch(int64_t n) const {
  ConvProblem p = *this;
  p.x.shape.n = n;
  p.y.shape.n = n;
  return p;
}

std::string ConvProblem::str() const {
  return "x=" + x.shape.str() + "(" + layout_name(x.layout) + ") w=" + weight_shape().str() +
         " y=" + y.shape.str() + "(" + layout_name(y.layout) + ") pad=" +
         std::to_string(window.pad_h) + "," + std::to_string(window.pad_w) +
         " stride=" + std::to_string(window.stride_h) + "," + std::to_string(window.stride_w) +
         (groups == 1 ? "" : " groups=" + std::to_string(groups)) +
         (x.dtype == DataType::kF32 ? "" : std::string(" ") + dtype_name(x.dtype));
}

std::string ConvProblem::geometry_error() const {
  if (groups < 1 || x.shape.c % groups != 0 || k % groups != 0) {
    // Not str(): weight_shape() divides by groups.
    return "convolution x=" + x.shape.str() + " k=" + std::to_string(k) + ": groups " +
           std::to_string(groups) +
           " must divide the input channels " + std::to_string(x.shape.c) +
           " and the output channels " + std::to_string(k);
  }
  if (!(y.shape == output_shape())) {
    return "convolution " + str() + ": output shape should be " + output_shape().str();
  }
  return {};
}

void check_same_dtype(const char* backend, const char* op,
                      std::initializer_list<TensorDesc> tensors) {
  for (const TensorDesc& t : tensors) {
    if (t.dtype != tensors.begin()->dtype) {
      throw BackendError(std::string(backend) + ": " + op + ": tensors of one call must share " +
                         "an element type, got " + dtype_name(tensors.begin()->dtype) + " " +
                         tensors.begin()->shape.str() + " and " + dtype_name(t.dtype) + " " +
                         t.shape.str());
    }
  }
}

namespace {

// How `b` differs from `a`: "x is bf16, y is f32; x is 2x3x4x4, y is ..."
std::string desc_difference(const char* a_name, const TensorDesc& a, const char* b_name,
                            const TensorDesc& b) {
  std::string text;
  const auto differ = [&](const std::string& of_a, const std::string& of_b) {
    if (of_a == of_b) return;
    text += std::string(text.empty() ? "" : "; ") + a_name + " is " + of_a + ", " + b_name +
            " is " + of_b;
  };
  differ(dtype_name(a.dtype), dtype_name(b.dtype));
  differ(a.shape.str(), b.shape.str());
  differ(layout_name(a.layout), layout_name(b.layout));
  return text;
}

}  // namespace

void check_same_desc(const char* backend, const char* op,
                     std::initializer_list<std::pair<const char*, TensorDesc>> tensors) {
  const auto& [first_name, first] = *tensors.begin();
  for (const auto& [name, desc] : tensors) {
    if (!(desc == first)) {
      throw BackendError(std::string(backend) + ": " + op + ": " +
                         desc_difference(first_name, first, name, desc));
    }
  }
}

Layout LayoutRule::operator()(int64_t channels) const {
  switch (choice) {
    case LayoutChoice::kNchw: return Layout::kPlain;
    case LayoutChoice::kNhwc: return Layout::kNhwc;
    case LayoutChoice::kAuto: break;
  }
  // Half precision on a GPU: channels last where the channels come in the
  // 8-element (16-byte) groups cuDNN's NHWC tensor-core kernels read.
  // LeNet's 20- and 50-channel activations trained 1.6x slower in NHWC
  // than in NCHW in fp16 on an H100 (52k against 86k img/s; the same in
  // bf16), where ResNet-18's trained faster.
  if (gpu) {
    return common::is_half(precision) && channels % 8 == 0 ? Layout::kNhwc : Layout::kPlain;
  }
  // Blocked layouts pad channels up to the block; below one block the
  // padding would cost more than the vector kernels gain.
  if (native_block == 16 && channels >= 16) return Layout::kBlocked16;
  if (native_block >= 8 && channels >= 8) return Layout::kBlocked8;
  return Layout::kPlain;
}

bool is_graph_engine(std::string_view name) {
  return name.size() > 3 && name.starts_with("eng") && name[3] >= '0' && name[3] <= '9';
}

bool conv_algorithm_allowed(std::string_view name, common::Precision p, bool graph_engines) {
  using common::Precision;
  if (is_graph_engine(name) && !graph_engines) return false;
  if (name.ends_with(kTf32AlgorithmSuffix)) return p == Precision::kTf32;
  if (name.ends_with(kPseudoHalfAlgorithmSuffix) || name.ends_with(kTrueHalfAlgorithmSuffix)) {
    return p == Precision::kFp16;
  }
  if (name.ends_with(kPseudoBf16AlgorithmSuffix)) return p == Precision::kBf16;
  return true;
}

void check_beta(const char* backend, const char* op, float beta) {
  if (beta != 0.0f && beta != 1.0f) {
    throw BackendError(std::string(backend) + ": " + op + ": beta must be 0 or 1, got " +
                       std::to_string(beta));
  }
}

void check_concat_slice(const Shape& dy, int64_t channel_offset, const Shape& dx) {
  if (dx.n != dy.n || dx.h != dy.h || dx.w != dy.w || channel_offset < 0 ||
      channel_offset + dx.c > dy.c) {
    throw BackendError("concat_backward: slice " + dx.str() + " at channel " +
                       std::to_string(channel_offset) + " does not fit " + dy.str());
  }
}

bool check_mul(const char* backend, const BinaryDesc& op) {
  const Shape& a = op.a.shape;
  const Shape& b = op.b.shape;
  const Shape& y = op.y.shape;
  const Shape per_channel{a.n, a.c, 1, 1};
  const char* name = binary_name(op.kind);
  const auto fail = [&](const std::string& expected) {
    throw BackendError(std::string(backend) + ": " + name + ": " + expected + "; got a " +
                       a.str() + ", b " + b.str() + ", y " + y.str());
  };
  check_beta(backend, name, op.beta);
  check_same_dtype(backend, name, {op.a, op.b, op.y});
  if (op.kind == BinaryKind::kMulSum) {
    if (!(b == a) || !(y == per_channel)) fail("b shaped like a and y " + per_channel.str());
    return false;
  }
  if (!(y == a) || !(b == a || b == per_channel)) {
    fail("y shaped like a and b like a or " + per_channel.str());
  }
  return !(b == a);
}

namespace {

const char* direction_name(Direction d) { return d == Direction::kForward ? "forward" : "backward"; }

const char* batch_norm_kind_name(BatchNormKind kind) {
  switch (kind) {
    case BatchNormKind::kForwardTraining: return "training";
    case BatchNormKind::kForwardInference: return "inference";
    case BatchNormKind::kBackward: return "backward";
    case BatchNormKind::kSums: return "sums";
    case BatchNormKind::kBackwardSums: return "backward_sums";
    case BatchNormKind::kBackwardData: return "backward_data";
  }
  return "?";
}

const char* inner_product_kind_name(InnerProductKind kind) {
  switch (kind) {
    case InnerProductKind::kForward: return "forward";
    case InnerProductKind::kBackwardData: return "backward_data";
    case InnerProductKind::kBackwardWeights: return "backward_weights";
  }
  return "?";
}

// The element type of an op's activations (f32 for the optimizers' arrays).
DataType op_dtype(const OpDesc& op) {
  std::optional<DataType> type;
  for_each_tensor_desc(op, [&](const TensorDesc& d) {
    if (!type) type = d.dtype;
  });
  return type.value_or(DataType::kF32);
}

}  // namespace

const char* activation_name(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kRelu: return "relu";
    case ActivationKind::kSilu: return "silu";
    case ActivationKind::kGelu: return "gelu";
    case ActivationKind::kSigmoid: return "sigmoid";
    case ActivationKind::kRelu6: return "relu6";
  }
  return "?";
}

const char* binary_name(BinaryKind kind) {
  switch (kind) {
    case BinaryKind::kAdd: return "add";
    case BinaryKind::kAccumulate: return "accumulate";
    case BinaryKind::kMul: return "mul";
    case BinaryKind::kMulSum: return "mul_sum";
  }
  return "?";
}

std::string op_name(const OpDesc& op) {
  return std::visit(
      op_table_detail::Overload{
          [](const ConvDesc& d) { return std::string("conv ") + conv_kind_name(d.kind); },
          [](const ActivationDesc& d) {
            return std::string(activation_name(d.kind)) + " " + direction_name(d.direction) +
                   (d.bias ? " (bias)" : "");
          },
          [](const PoolDesc& d) {
            return std::string(d.kind == PoolKind::kMax ? "max" : "average") + " pooling " +
                   direction_name(d.direction);
          },
          [](const InnerProductDesc& d) {
            return std::string("inner_product ") + inner_product_kind_name(d.kind);
          },
          [](const BatchNormDesc& d) {
            return std::string("batch_norm ") + batch_norm_kind_name(d.kind);
          },
          [](const BinaryDesc& d) { return std::string(binary_name(d.kind)); },
          [](const ConcatDesc& d) { return std::string("concat ") + direction_name(d.direction); },
          [](const SoftmaxCrossEntropyDesc&) { return std::string("softmax_cross_entropy"); },
          [](const SgdDesc&) { return std::string("sgd"); },
          [](const AdamWDesc&) { return std::string("adamw"); },
          [](const MovingAverageDesc&) { return std::string("moving_average"); },
          [](const ScaleDesc&) { return std::string("scale"); },
          [](const SumSquaresDesc&) { return std::string("sum_squares"); },
          [](const AllFiniteDesc&) { return std::string("all_finite"); },
          [](const DropoutDesc& d) { return std::string("dropout ") + direction_name(d.direction); },
      },
      op);
}

std::optional<std::string> dtype_unsupported(const Device& device, const OpDesc& op) {
  const DataType type = op_dtype(op);
  if (type == DataType::kF32) return std::nullopt;
  const auto why = device.precision_unavailable(type == DataType::kBF16 ? common::Precision::kBf16
                                                                        : common::Precision::kFp16);
  if (!why) return std::nullopt;
  return op_name(op) + " in " + dtype_name(type) + ": " + *why;
}

}  // namespace vtrain::worker
