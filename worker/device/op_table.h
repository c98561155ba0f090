// Internal to the backends (worker/device/*): the table from an op's
// descriptor to a backend's kernel functions, written once for every
// backend. A backend implements Backend::run() and scratch_bytes() as
//   run_op(*this, op, args);  return op_bytes(*this, op);
// over its kernels, members with these names and arguments (Tensors are
// the descriptor's TensorDescs joined with the Args' pointers):
//
//   conv_forward(algo, problem, x, w, bias, y, beta, workspace, workspace_bytes)
//   conv_backward_data(algo, problem, dy, w, dx, beta, workspace, workspace_bytes)
//   conv_backward_filter(algo, problem, x, dy, dw, dbias, beta, workspace, workspace_bytes)
//   conv_workspace(kind, algo, problem, accumulate) -> size_t
//   relu_forward(x, y)                 bias_relu_forward(x, bias, y)
//   relu_backward(y, dy, dx)           relu_backward_bias(y, dy, dx, dbias)
//   relu_scratch_bytes(x) -> size_t
//   activation_forward(kind, x, y)     activation_backward(kind, x, dy, dx)
//   activation_scratch_bytes(kind, x) -> size_t   (every kind but relu)
//   pooling_forward(desc, x, y, state) pooling_backward(desc, x, y, dy, dx, state)
//   pooling_state_bytes(desc, x, y) -> size_t, pooling_scratch_bytes(desc, x, y) -> size_t
//   inner_product_forward(x, w, bias, y)
//   inner_product_backward_data(dy, w, dx)
//   inner_product_backward_weights(x, dy, dw, dbias, beta)
//   inner_product_scratch_bytes(x, out, bias) -> size_t
//   batch_norm_forward_training(x, y, scale_shift, save_mean, save_var,
//                               running_mean, running_var, momentum, eps)
//   batch_norm_forward_inference(x, y, scale_shift, mean, var, eps)
//   batch_norm_backward(x, dy, scale_shift, mean, var, dx, dscale_shift, beta, eps)
//   batch_norm_sums(x) -> std::vector<double>
//   batch_norm_backward_sums(x, dy, mean, var, eps) -> std::vector<double>
//   batch_norm_backward_data(x, dy, scale_shift, mean, var, dy_means, dx, eps)
//   batch_norm_scratch_bytes(x, eps) -> size_t
//   add(a, b, y)  accumulate(x, y, beta)  add_scratch_bytes(a, b, y) -> size_t
//   mul(a, b, y, beta)  mul_sum(a, b, y, beta)  mul_scratch_bytes(kind, a, b, y) -> size_t
//   concat_forward(span<const Tensor> xs, y)  concat_backward(dy, offset, dx, beta)
//   concat_scratch_bytes(span<const TensorDesc> xs, y) -> size_t
//   softmax_cross_entropy(logits, labels, scale, const Tensor* dlogits, smoothing) -> LossStats
//   softmax_scratch_bytes(logits) -> size_t
//   sgd_update(w, g, velocity, count, step)   adamw_update(w, g, m, v, count, step)
//   moving_average(average, x, count, decay)  scale(x, count, alpha)
//   sum_squares(x, offsets) -> std::vector<double>, sum_squares_scratch_bytes(segments)
//   all_finite(x, count) -> bool
//   dropout(desc, in, out)             (forward x -> y, backward dy -> dx)
//
// Adding an op family adds its line here and its kernels to each backend.
#pragma once

#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "worker/device/backend.h"

namespace vtrain::worker {

namespace op_table_detail {

template <class... F>
struct Overload : F... {
  using F::operator()...;
};

// The OpArgs alternative of descriptor type D.
template <class D> struct ArgsOf;
template <> struct ArgsOf<ConvDesc> { using type = ConvArgs; };
template <> struct ArgsOf<ActivationDesc> { using type = ActivationArgs; };
template <> struct ArgsOf<PoolDesc> { using type = PoolArgs; };
template <> struct ArgsOf<InnerProductDesc> { using type = InnerProductArgs; };
template <> struct ArgsOf<BatchNormDesc> { using type = BatchNormArgs; };
template <> struct ArgsOf<BinaryDesc> { using type = BinaryArgs; };
template <> struct ArgsOf<ConcatDesc> { using type = ConcatArgs; };
template <> struct ArgsOf<SoftmaxCrossEntropyDesc> { using type = SoftmaxCrossEntropyArgs; };
template <> struct ArgsOf<SgdDesc> { using type = SgdArgs; };
template <> struct ArgsOf<AdamWDesc> { using type = AdamWArgs; };
template <> struct ArgsOf<MovingAverageDesc> { using type = MovingAverageArgs; };
template <> struct ArgsOf<ScaleDesc> { using type = ScaleArgs; };
template <> struct ArgsOf<SumSquaresDesc> { using type = SumSquaresArgs; };
template <> struct ArgsOf<AllFiniteDesc> { using type = AllFiniteArgs; };
template <> struct ArgsOf<DropoutDesc> { using type = DropoutArgs; };

inline Tensor view(const TensorDesc& desc, const void* data) {
  return {desc, const_cast<void*>(data)};
}

// A result pointer an op that returns host values needs.
template <class T>
T& result(T* out, const OpDesc& op) {
  if (!out) throw BackendError(op_name(op) + ": no result pointer in its args");
  return *out;
}

}  // namespace op_table_detail

// The args of `op`'s family, or BackendError when `args` holds another's.
template <class D>
const typename op_table_detail::ArgsOf<D>::type& args_of(const D&, const OpDesc& op,
                                                         const OpArgs& args) {
  using A = typename op_table_detail::ArgsOf<D>::type;
  if (const A* a = std::get_if<A>(&args)) return *a;
  throw BackendError(op_name(op) + ": its args are another op's (OpArgs index " +
                     std::to_string(args.index()) + ", the op's " + std::to_string(op.index()) +
                     ")");
}

template <class Kernels>
void run_op(Kernels& k, const OpDesc& op, const OpArgs& any_args) {
  using op_table_detail::result;
  using op_table_detail::view;
  std::visit(
      op_table_detail::Overload{
          [&](const ConvDesc& d) {
            const ConvArgs& a = args_of(d, op, any_args);
            const ConvProblem& p = d.problem;
            switch (d.kind) {
              case ConvKind::kForward:
                return k.conv_forward(d.algo, p, view(p.x, a.x), a.w, d.bias ? a.bias : nullptr,
                                      view(p.y, a.y), d.beta, a.workspace, a.workspace_bytes);
              case ConvKind::kBackwardData:
                return k.conv_backward_data(d.algo, p, view(p.y, a.dy), a.w, view(p.x, a.dx),
                                            d.beta, a.workspace, a.workspace_bytes);
              case ConvKind::kBackwardFilter:
                return k.conv_backward_filter(d.algo, p, view(p.x, a.x), view(p.y, a.dy), a.dw,
                                              d.bias ? a.dbias : nullptr, d.beta, a.workspace,
                                              a.workspace_bytes);
            }
          },
          [&](const ActivationDesc& d) {
            const ActivationArgs& a = args_of(d, op, any_args);
            if (d.kind != ActivationKind::kRelu) {
              if (d.bias) throw BackendError(op_name(op) + ": a bias pairs with relu only");
              if (d.direction == Direction::kForward) {
                return k.activation_forward(d.kind, view(d.x, a.x), view(d.y, a.y));
              }
              return k.activation_backward(d.kind, view(d.x, a.x), view(d.dy, a.dy),
                                           view(d.dx, a.dx));
            }
            if (d.direction == Direction::kForward) {
              if (d.bias) return k.bias_relu_forward(view(d.x, a.x), a.bias, view(d.y, a.y));
              return k.relu_forward(view(d.x, a.x), view(d.y, a.y));
            }
            if (d.bias) {
              return k.relu_backward_bias(view(d.y, a.y), view(d.dy, a.dy), view(d.dx, a.dx),
                                          a.dbias);
            }
            return k.relu_backward(view(d.y, a.y), view(d.dy, a.dy), view(d.dx, a.dx));
          },
          [&](const PoolDesc& d) {
            const PoolArgs& a = args_of(d, op, any_args);
            if (d.direction == Direction::kForward) {
              return k.pooling_forward(d, view(d.x, a.x), view(d.y, a.y), a.state);
            }
            return k.pooling_backward(d, view(d.x, a.x), view(d.y, a.y), view(d.dy, a.dy),
                                      view(d.dx, a.dx), a.state);
          },
          [&](const InnerProductDesc& d) {
            const InnerProductArgs& a = args_of(d, op, any_args);
            switch (d.kind) {
              case InnerProductKind::kForward:
                return k.inner_product_forward(view(d.x, a.x), a.w, d.bias ? a.bias : nullptr,
                                               view(d.y, a.y));
              case InnerProductKind::kBackwardData:
                return k.inner_product_backward_data(view(d.y, a.dy), a.w, view(d.x, a.dx));
              case InnerProductKind::kBackwardWeights:
                return k.inner_product_backward_weights(view(d.x, a.x), view(d.y, a.dy), a.dw,
                                                        d.bias ? a.dbias : nullptr, d.beta);
            }
          },
          [&](const BatchNormDesc& d) {
            const BatchNormArgs& a = args_of(d, op, any_args);
            const Tensor x = view(d.x, a.x);
            switch (d.kind) {
              case BatchNormKind::kForwardTraining:
                return k.batch_norm_forward_training(x, view(d.y, a.y), a.scale_shift, a.mean,
                                                     a.var, a.running_mean, a.running_var,
                                                     d.momentum, d.eps);
              case BatchNormKind::kForwardInference:
                return k.batch_norm_forward_inference(x, view(d.y, a.y), a.scale_shift, a.mean,
                                                      a.var, d.eps);
              case BatchNormKind::kBackward:
                return k.batch_norm_backward(x, view(d.dy, a.dy), a.scale_shift, a.mean, a.var,
                                             view(d.dx, a.dx), a.dscale_shift, d.beta, d.eps);
              case BatchNormKind::kSums:
                result(a.sums, op) = k.batch_norm_sums(x);
                return;
              case BatchNormKind::kBackwardSums:
                result(a.sums, op) =
                    k.batch_norm_backward_sums(x, view(d.dy, a.dy), a.mean, a.var, d.eps);
                return;
              case BatchNormKind::kBackwardData:
                return k.batch_norm_backward_data(x, view(d.dy, a.dy), a.scale_shift, a.mean,
                                                  a.var, a.dy_means, view(d.dx, a.dx), d.eps);
            }
          },
          [&](const BinaryDesc& d) {
            const BinaryArgs& a = args_of(d, op, any_args);
            switch (d.kind) {
              case BinaryKind::kAccumulate:
                return k.accumulate(view(d.a, a.a), view(d.y, a.y), d.beta);
              case BinaryKind::kMul:
                return k.mul(view(d.a, a.a), view(d.b, a.b), view(d.y, a.y), d.beta);
              case BinaryKind::kMulSum:
                return k.mul_sum(view(d.a, a.a), view(d.b, a.b), view(d.y, a.y), d.beta);
              case BinaryKind::kAdd: break;
            }
            return k.add(view(d.a, a.a), view(d.b, a.b), view(d.y, a.y));
          },
          [&](const ConcatDesc& d) {
            const ConcatArgs& a = args_of(d, op, any_args);
            if (d.direction == Direction::kBackward) {
              if (d.xs.size() != 1) {
                throw BackendError(op_name(op) + ": takes one input's descriptor, got " +
                                   std::to_string(d.xs.size()));
              }
              return k.concat_backward(view(d.y, a.dy), d.channel_offset, view(d.xs[0], a.dx),
                                       d.beta);
            }
            if (a.xs.size() != d.xs.size()) {
              throw BackendError(op_name(op) + ": " + std::to_string(d.xs.size()) +
                                 " inputs described, " + std::to_string(a.xs.size()) + " given");
            }
            std::vector<Tensor> xs;
            for (size_t i = 0; i < d.xs.size(); ++i) xs.push_back(view(d.xs[i], a.xs[i]));
            return k.concat_forward(xs, view(d.y, a.y));
          },
          [&](const SoftmaxCrossEntropyDesc& d) {
            const SoftmaxCrossEntropyArgs& a = args_of(d, op, any_args);
            const Tensor dlogits = view(d.logits, a.dlogits);
            result(a.stats, op) =
                k.softmax_cross_entropy(view(d.logits, a.logits), a.labels, d.scale,
                                        d.gradient ? &dlogits : nullptr, d.label_smoothing);
          },
          [&](const SgdDesc& d) {
            const SgdArgs& a = args_of(d, op, any_args);
            k.sgd_update(a.w, a.g, a.velocity, d.count, d.step);
          },
          [&](const AdamWDesc& d) {
            const AdamWArgs& a = args_of(d, op, any_args);
            k.adamw_update(a.w, a.g, a.m, a.v, d.count, d.step);
          },
          [&](const MovingAverageDesc& d) {
            const MovingAverageArgs& a = args_of(d, op, any_args);
            k.moving_average(a.average, a.x, d.count, d.decay);
          },
          [&](const ScaleDesc& d) {
            const ScaleArgs& a = args_of(d, op, any_args);
            k.scale(a.x, d.count, d.alpha);
          },
          [&](const SumSquaresDesc& d) {
            const SumSquaresArgs& a = args_of(d, op, any_args);
            if (a.offsets.size() != d.segments + 1 && !(a.offsets.empty() && d.segments == 0)) {
              throw BackendError(op_name(op) + ": " + std::to_string(d.segments) +
                                 " segments need " + std::to_string(d.segments + 1) +
                                 " offsets, got " + std::to_string(a.offsets.size()));
            }
            result(a.sums, op) = k.sum_squares(a.x, a.offsets);
          },
          [&](const AllFiniteDesc& d) {
            const AllFiniteArgs& a = args_of(d, op, any_args);
            result(a.finite, op) = k.all_finite(a.x, d.count);
          },
          [&](const DropoutDesc& d) {
            const DropoutArgs& a = args_of(d, op, any_args);
            if (!(d.p >= 0.0f && d.p < 1.0f)) {
              throw BackendError(op_name(op) + ": p must be in [0, 1), got " + std::to_string(d.p));
            }
            if (d.direction == Direction::kForward) {
              return k.dropout(d, view(d.x, a.x), view(d.x, a.y));
            }
            return k.dropout(d, view(d.x, a.dy), view(d.x, a.dx));
          },
      },
      op);
}

template <class Kernels>
OpBytes op_bytes(Kernels& k, const OpDesc& op) {
  return std::visit(
      op_table_detail::Overload{
          [&](const ConvDesc& d) -> OpBytes {
            return {k.conv_workspace(d.kind, d.algo, d.problem, d.beta != 0.0f), 0};
          },
          [&](const ActivationDesc& d) -> OpBytes {
            if (d.kind != ActivationKind::kRelu) return {k.activation_scratch_bytes(d.kind, d.x), 0};
            return {k.relu_scratch_bytes(d.direction == Direction::kForward ? d.x : d.y), 0};
          },
          [&](const PoolDesc& d) -> OpBytes {
            return {k.pooling_scratch_bytes(d, d.x, d.y), k.pooling_state_bytes(d, d.x, d.y)};
          },
          [&](const InnerProductDesc& d) -> OpBytes {
            return {k.inner_product_scratch_bytes(d.x, d.y.shape.c, d.bias), 0};
          },
          [&](const BatchNormDesc& d) -> OpBytes {
            return {k.batch_norm_scratch_bytes(d.x, d.eps), 0};
          },
          [&](const BinaryDesc& d) -> OpBytes {
            switch (d.kind) {
              case BinaryKind::kAccumulate: return {k.add_scratch_bytes(d.y, d.a, d.y), 0};
              case BinaryKind::kMul:
              case BinaryKind::kMulSum: return {k.mul_scratch_bytes(d.kind, d.a, d.b, d.y), 0};
              case BinaryKind::kAdd: break;
            }
            return {k.add_scratch_bytes(d.a, d.b, d.y), 0};
          },
          [&](const ConcatDesc& d) -> OpBytes { return {k.concat_scratch_bytes(d.xs, d.y), 0}; },
          [&](const SoftmaxCrossEntropyDesc& d) -> OpBytes {
            return {k.softmax_scratch_bytes(d.logits), 0};
          },
          [&](const SumSquaresDesc& d) -> OpBytes {
            return {k.sum_squares_scratch_bytes(d.segments), 0};
          },
          // The optimizers' elementwise updates and all_finite need no scratch.
          [](const auto&) -> OpBytes { return {}; },
      },
      op);
}

// f(desc) for each TensorDesc of `op` (OpDesc or const OpDesc): what a
// wrapper that rewrites tensors (the half emulation) or asks of their type
// walks.
template <class Op, class F>
void for_each_tensor_desc(Op& op, F&& f) {
  std::visit(
      [&](auto& d) {
        using D = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<D, ConvDesc>) {
          f(d.problem.x), f(d.problem.y);
        } else if constexpr (std::is_same_v<D, ActivationDesc>) {
          if (d.direction == Direction::kForward) {
            f(d.x), f(d.y);
          } else {
            f(d.y), f(d.dy), f(d.dx);
          }
        } else if constexpr (std::is_same_v<D, BatchNormDesc>) {
          f(d.x);
          switch (d.kind) {
            case BatchNormKind::kForwardTraining:
            case BatchNormKind::kForwardInference: f(d.y); break;
            case BatchNormKind::kBackward:
            case BatchNormKind::kBackwardData: f(d.dy), f(d.dx); break;
            case BatchNormKind::kBackwardSums: f(d.dy); break;
            case BatchNormKind::kSums: break;
          }
        } else if constexpr (std::is_same_v<D, PoolDesc>) {
          f(d.x), f(d.y);
          if (d.direction == Direction::kBackward) f(d.dy), f(d.dx);
        } else if constexpr (std::is_same_v<D, InnerProductDesc>) {
          f(d.x), f(d.y);
        } else if constexpr (std::is_same_v<D, BinaryDesc>) {
          f(d.a), f(d.b), f(d.y);
        } else if constexpr (std::is_same_v<D, ConcatDesc>) {
          for (auto& x : d.xs) f(x);
          f(d.y);
        } else if constexpr (std::is_same_v<D, SoftmaxCrossEntropyDesc>) {
          f(d.logits);
        } else if constexpr (std::is_same_v<D, DropoutDesc>) {
          f(d.x);
        }
        // The optimizers' and reductions' arrays are f32, not tensors.
      },
      op);
}

// supports() for a backend whose kernels run every descriptor kind: what
// it refuses is an element type this device lacks.
std::optional<std::string> dtype_unsupported(const Device& device, const OpDesc& op);

}  // namespace vtrain::worker
