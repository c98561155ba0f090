// CPU backend: convolutions (oneDNN direct and winograd, also computing a
// bf16 problem in f32; im2col + sgemm).
#include "worker/device/cpu/cpu_backend_impl.h"

#include <cstring>

namespace vtrain::worker::cpu {

namespace {

void check_workspace(const char* op, size_t have, size_t need, const ConvProblem& p) {
  if (have < need) {
    throw BackendError(std::string("cpu backend: ") + op + " " + p.str() + " needs " +
                       std::to_string(need) + " workspace bytes, got " + std::to_string(have));
  }
}

}  // namespace

// ------------------------------------------------------------- convolution

namespace {

// An id's name, empty for an id no algorithm has.
std::string cpu_conv_algorithm_name(ConvAlgo algo) {
  switch (algo) {
    case kDirect: return "direct";
    case kWinograd: return "winograd";
    case kIm2colGemm: return "im2col_gemm";
    case kDirectPseudoBf16: return "direct" + std::string(kPseudoBf16AlgorithmSuffix);
    case kWinogradPseudoBf16: return "winograd" + std::string(kPseudoBf16AlgorithmSuffix);
  }
  return {};
}

}  // namespace

std::string CpuBackend::conv_algorithm_name(ConvKind, ConvAlgo algo) const {
  std::string name = cpu_conv_algorithm_name(algo);
  if (!name.empty()) return name;
  std::string known;
  for (ConvAlgo id = 0; !cpu_conv_algorithm_name(id).empty(); ++id) {
    known += (id == 0 ? "" : ", ") + std::to_string(id) + " " + cpu_conv_algorithm_name(id);
  }
  throw BackendError("cpu backend: unknown convolution algorithm id " + std::to_string(algo) +
                     " (known: " + known + ")");
}

namespace {

// The oneDNN algorithm of a direct or winograd id, pseudo or not.
dnnl::algorithm dnnl_algorithm(ConvAlgo algo) {
  return algo == kWinograd || algo == kWinogradPseudoBf16 ? dnnl::algorithm::convolution_winograd
                                                           : dnnl::algorithm::convolution_direct;
}
// Whether the primitive computes in f32 on the (bf16) problem's tensors.
bool computes_in_f32(ConvAlgo algo) {
  return algo == kDirectPseudoBf16 || algo == kWinogradPseudoBf16;
}

}  // namespace

std::vector<ConvAlgoInfo> CpuBackend::conv_algorithms(const ConvDesc& op) {
  const ConvKind kind = op.kind;
  const ConvProblem& p = op.problem;
  const bool accumulate = op.beta != 0.0f;
  std::vector<ConvAlgoInfo> algos;
  for (ConvAlgo algo : {kDirect, kWinograd, kIm2colGemm, kDirectPseudoBf16, kWinogradPseudoBf16}) {
    if (computes_in_f32(algo) && p.x.dtype != DataType::kBF16) continue;
    try {
      const ConvPlan& plan = conv_plan(kind, algo, p, accumulate, true);
      algos.push_back({algo, conv_algorithm_name(kind, algo), plan.workspace});
    } catch (const BackendError&) {
      // Not available for this problem on this CPU.
    }
  }
  return algos;
}

const ConvPlan& CpuBackend::conv_plan(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                      bool accumulate, bool has_bias) {
  if (std::string error = p.geometry_error(); !error.empty()) throw BackendError(error);
  const std::string key = std::to_string(static_cast<int>(kind)) + "/" + std::to_string(algo) +
                          "/" + p.str() + (accumulate ? "/acc" : "/set") +
                          (has_bias ? "/b" : "/nb");
  auto it = conv_plans_.find(key);
  if (it != conv_plans_.end()) return it->second;
  ConvPlan plan;
  if (algo == kIm2colGemm) {
    plan = build_im2col_conv(kind, p, accumulate, has_bias);
  } else if (algo == kDirect || algo == kWinograd || computes_in_f32(algo)) {
    plan = build_dnnl_conv(kind, algo, p, accumulate, has_bias);
  } else {
    conv_algorithm_name(kind, algo);  // throws naming the known ids
  }
  return conv_plans_.emplace(key, std::move(plan)).first->second;
}

// Makes `s` move data between the user's format and the primitive's when
// they differ (or when forced): its temporary is laid out at `cursor`; an
// output stage sums into the user buffer when accumulating.
static void prepare_stage(const dnnl::engine& engine, Stage& s, const memory::desc& user,
                          const memory::desc& prim, bool out, bool force, bool accumulate,
                          size_t& cursor) {
  s.user_md = user;
  s.prim_md = prim;
  s.active = force || user != prim;
  if (!s.active) return;
  s.offset = reserve(cursor, prim);
  if (out) {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    s.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, prim, engine, user, attr));
  } else {
    s.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(engine, user, engine, prim));
  }
}

// The weights (or their gradient) of p in `type` as oneDNN describes them:
// {k, c, r, s}, or grouped {groups, k / groups, c / groups, r, s} (goihw,
// the plain {k, c / groups, r, s} byte for byte); `plain` or the
// primitive's choice (any).
static memory::desc weights_md(const ConvProblem& p, DataType type, bool plain) {
  const Shape w = p.weight_shape();
  if (p.groups == 1) {
    return {{w.n, w.c, w.h, w.w}, dnnl_type(type), plain ? Tag::oihw : Tag::any};
  }
  return {{p.groups, w.n / p.groups, w.c, w.h, w.w}, dnnl_type(type),
          plain ? Tag::goihw : Tag::any};
}

ConvPlan CpuBackend::build_dnnl_conv(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                     bool accumulate, bool has_bias) {
  if (computes_in_f32(algo) && p.x.dtype != DataType::kBF16) {
    throw BackendError(std::string("cpu backend: ") + conv_kind_name(kind) + " algorithm " +
                       conv_algorithm_name(kind, algo) + " is for bf16 problems, not " + p.str());
  }
  const dnnl::algorithm alg = dnnl_algorithm(algo);
  const memory::dims strides{p.window.stride_h, p.window.stride_w};
  const memory::dims pad{p.window.pad_h, p.window.pad_w};
  // Activations, the weights and the forward bias in the problem's type,
  // which the primitive computes in unless the algorithm computes in f32
  // (the stages below then convert them); weight and bias gradients in
  // f32 (backend.h).
  const DataType type = p.x.dtype;
  const DataType compute = computes_in_f32(algo) ? DataType::kF32 : type;
  const memory::desc x_any = any_md(p.x.shape, compute);
  const memory::desc y_any = any_md(p.y.shape, compute);
  const memory::desc w_any = weights_md(p, compute, false);
  const memory::desc b_md = has_bias ? vector_md(p.k, compute) : memory::desc();
  const memory::desc dw_any = weights_md(p, DataType::kF32, false);
  const memory::desc db_md = has_bias ? vector_md(p.k) : memory::desc();

  ConvPlan plan;
  size_t cursor = 0;
  auto stage = [&](Stage& s, const memory::desc& user, const memory::desc& prim, bool out,
                   bool force) {
    prepare_stage(engine_, s, user, prim, out, force, accumulate, cursor);
  };

  try {
    // The forward descriptor is also the hint backward primitives need.
    const bool fwd_sum = kind == ConvKind::kForward && accumulate;
    dnnl::convolution_forward::desc fwd_desc(dnnl::prop_kind::forward_training, alg, x_any, w_any,
                                             kind == ConvKind::kForward ? b_md : memory::desc(),
                                             y_any, strides, pad, pad);
    dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, user_scratchpad_attr(), engine_);
    switch (kind) {
      case ConvKind::kForward: {
        // With a sum post-op the primitive accumulates into dst itself, but
        // only when dst is already in the primitive's format.
        const bool dst_matches = fwd_pd.dst_desc() == md_of(p.y);
        auto pd = (fwd_sum && dst_matches)
                      ? dnnl::convolution_forward::primitive_desc(fwd_desc,
                                                                  user_scratchpad_attr(true), engine_)
                      : fwd_pd;
        plan.prim = dnnl::convolution_forward(pd);
        plan.scratch_md = pd.scratchpad_desc();
        stage(plan.in0, md_of(p.x), pd.src_desc(), false, false);
        stage(plan.in1, weights_md(p, type, true), pd.weights_desc(), false, false);
        stage(plan.out, md_of(p.y), pd.dst_desc(), true, false);
        if (has_bias) stage(plan.in_bias, vector_md(p.k, type), b_md, false, false);
        break;
      }
      case ConvKind::kBackwardData: {
        dnnl::convolution_backward_data::desc d(alg, x_any, w_any, y_any, strides, pad, pad);
        dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad_attr(), engine_,
                                                           fwd_pd);
        plan.prim = dnnl::convolution_backward_data(pd);
        plan.scratch_md = pd.scratchpad_desc();
        stage(plan.in0, md_of(p.y), pd.diff_dst_desc(), false, false);
        stage(plan.in1, weights_md(p, type, true), pd.weights_desc(), false, false);
        stage(plan.out, md_of(p.x), pd.diff_src_desc(), true, accumulate);
        break;
      }
      case ConvKind::kBackwardFilter: {
        dnnl::convolution_backward_weights::desc d(alg, x_any, dw_any, db_md, y_any, strides,
                                                   pad, pad);
        dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad_attr(), engine_,
                                                              fwd_pd);
        plan.prim = dnnl::convolution_backward_weights(pd);
        plan.scratch_md = pd.scratchpad_desc();
        stage(plan.in0, md_of(p.x), pd.src_desc(), false, false);
        stage(plan.in1, md_of(p.y), pd.diff_dst_desc(), false, false);
        stage(plan.out, weights_md(p, DataType::kF32, true), pd.diff_weights_desc(), true, accumulate);
        if (has_bias) stage(plan.out_bias, db_md, pd.diff_bias_desc(), true, accumulate);
        break;
      }
    }
  } catch (const dnnl::error& e) {
    throw BackendError(std::string("cpu backend: ") + conv_kind_name(kind) + " algorithm " +
                       conv_algorithm_name(kind, algo) + " is not available for " + p.str() +
                       ": " + e.what());
  }
  plan.scratch_offset = reserve(cursor, plan.scratch_md);
  plan.workspace = cursor;
  return plan;
}

ConvPlan CpuBackend::build_im2col_conv(ConvKind kind, const ConvProblem& p, bool accumulate,
                                       bool has_bias) {
  if (p.x.dtype != DataType::kF32) {
    throw BackendError("cpu backend: im2col_gemm runs in f32 only, not for " + p.str());
  }
  ConvPlan plan;
  plan.im2col = true;
  const Shape y = p.output_shape();
  plan.geometry = {p.x.shape.n, p.x.shape.c, p.x.shape.h, p.x.shape.w, p.window.kernel_h, p.window.kernel_w, p.window.pad_h,
                   p.window.pad_w, p.window.stride_h, p.window.stride_w, y.h, y.w};
  size_t cursor = 0;
  const size_t cols_bytes =
      static_cast<size_t>(plan.geometry.rows() * plan.geometry.cols()) * sizeof(float);
  plan.cols_offset = cursor;
  cursor += align_up(cols_bytes);
  // in0: the input in plain NCHW (x) or the output gradient in CNHW (dy);
  // out: the result staged before it is reordered (and summed) into place.
  const bool x_plain = p.x.layout == Layout::kPlain;
  switch (kind) {
    case ConvKind::kForward:
      plan.in0.active = !x_plain;
      if (plan.in0.active) plan.in0.offset = reserve(cursor, plain_md(p.x.shape));
      plan.out.active = true;
      plan.out.offset = reserve(cursor, cnhw_md(y));
      break;
    case ConvKind::kBackwardData:
      plan.in0.active = true;
      plan.in0.offset = reserve(cursor, cnhw_md(y));
      plan.out.active = !x_plain;
      if (plan.out.active) plan.out.offset = reserve(cursor, plain_md(p.x.shape));
      break;
    case ConvKind::kBackwardFilter:
      plan.in0.active = !x_plain;
      if (plan.in0.active) plan.in0.offset = reserve(cursor, plain_md(p.x.shape));
      plan.in1.active = true;
      plan.in1.offset = reserve(cursor, cnhw_md(y));
      break;
  }
  (void)accumulate;  // GEMM beta and reorder-sum accumulate without extra space
  plan.workspace = cursor;
  return plan;
}

void CpuBackend::sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a,
                       int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                       int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    throw BackendError("cpu backend: dnnl_sgemm failed with status " + std::to_string(st));
  }
}

void CpuBackend::run_im2col(ConvKind kind, const ConvPlan& plan, const ConvProblem& p,
                            const Tensor* x, const void* w_in, const void* bias_in,
                            const Tensor* dy,
                            const Tensor* out, float* dw, float* dbias, float beta, char* ws) {
  const Im2colGeometry& g = plan.geometry;
  // im2col plans exist for f32 problems only (build_im2col_conv).
  const auto* w = static_cast<const float*>(w_in);
  const auto* bias = static_cast<const float*>(bias_in);
  const Shape y_shape = p.output_shape();
  float* cols = reinterpret_cast<float*>(ws + plan.cols_offset);
  // One GEMM per group: group i's filters are K rows of CRS weights from
  // row i * K, its columns the CRS rows of cols from i * CRS (im2col orders
  // them by input channel), its outputs K rows of NPQ from i * K.
  const int64_t G = p.groups, K = p.k / G, CRS = g.rows() / G, NPQ = g.cols();
  const auto per_group = [G](auto&& gemm) {
    for (int64_t i = 0; i < G; ++i) gemm(i);
  };
  auto plain_x = [&](const Tensor& t, const Stage& s) -> const float* {
    if (!s.active) return static_cast<const float*>(t.data);
    float* tmp = reinterpret_cast<float*>(ws + s.offset);
    reorder(md_of(t.desc), t.data, plain_md(t.shape()), tmp);
    return tmp;
  };
  switch (kind) {
    case ConvKind::kForward: {
      im2col(g, plain_x(*x, plan.in0), cols);
      float* yt = reinterpret_cast<float*>(ws + plan.out.offset);  // K x NPQ (CNHW)
      per_group([&](int64_t i) {
        sgemm('N', 'N', K, NPQ, CRS, w + i * K * CRS, CRS, cols + i * CRS * NPQ, NPQ, 0.0f,
              yt + i * K * NPQ, NPQ);
      });
      if (bias) {
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < p.k; ++k) {
          for (int64_t i = 0; i < NPQ; ++i) yt[k * NPQ + i] += bias[k];
        }
      }
      reorder(cnhw_md(y_shape), yt, md_of(out->desc), out->data, beta != 0.0f);
      break;
    }
    case ConvKind::kBackwardData: {
      float* dyt = reinterpret_cast<float*>(ws + plan.in0.offset);
      reorder(md_of(dy->desc), dy->data, cnhw_md(y_shape), dyt);
      per_group([&](int64_t i) {
        sgemm('T', 'N', CRS, NPQ, K, w + i * K * CRS, CRS, dyt + i * K * NPQ, NPQ, 0.0f,
              cols + i * CRS * NPQ, NPQ);
      });
      float* dx = plan.out.active ? reinterpret_cast<float*>(ws + plan.out.offset)
                                  : static_cast<float*>(out->data);
      const bool fold_into_user = !plan.out.active;
      if (!fold_into_user || beta == 0.0f) {
        std::memset(dx, 0, static_cast<size_t>(p.x.shape.elements()) * sizeof(float));
      }
      col2im_accumulate(g, cols, dx);
      if (!fold_into_user) {
        reorder(plain_md(p.x.shape), dx, md_of(out->desc), out->data, beta != 0.0f);
      }
      break;
    }
    case ConvKind::kBackwardFilter: {
      im2col(g, plain_x(*x, plan.in0), cols);
      float* dyt = reinterpret_cast<float*>(ws + plan.in1.offset);
      reorder(md_of(dy->desc), dy->data, cnhw_md(y_shape), dyt);
      per_group([&](int64_t i) {
        sgemm('N', 'T', K, CRS, NPQ, dyt + i * K * NPQ, NPQ, cols + i * CRS * NPQ, NPQ, beta,
              dw + i * K * CRS, CRS);
      });
      if (dbias) {
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < p.k; ++k) {
          double sum = 0.0;
          for (int64_t i = 0; i < NPQ; ++i) sum += dyt[k * NPQ + i];
          // beta = 0 must not read dbias: it may hold anything, NaN included.
          dbias[k] = beta == 0.0f ? static_cast<float>(sum) : static_cast<float>(sum) + dbias[k];
        }
      }
      break;
    }
  }
}


void CpuBackend::run_dnnl_conv(ConvKind kind, const ConvPlan& plan, char* ws, const void* in0,
                               const void* in1, void* out, const void* bias, float* dbias) {
  // Argument ids of the two inputs and the output, per kind.
  static constexpr int kArgs[3][3] = {
      {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
      {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
      {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
  };
  const int* ids = kArgs[static_cast<int>(kind)];
  std::unordered_map<int, memory> args;
  auto input = [&](const Stage& s, const void* user, int arg) {
    if (s.active) {
      run_reorder(s.reorder, mem(s.user_md, user), mem(s.prim_md, ws + s.offset));
      args[arg] = mem(s.prim_md, ws + s.offset);
    } else {
      args[arg] = mem(s.user_md, user);
    }
  };
  // An output staged in the workspace is reordered (and, when
  // accumulating, summed) into place after the primitive.
  auto output = [&](const Stage& s, void* user, int arg) {
    args[arg] = s.active ? mem(s.prim_md, ws + s.offset) : mem(s.user_md, user);
  };
  auto finish = [&](const Stage& s, void* user) {
    if (s.active) run_reorder(s.reorder, mem(s.prim_md, ws + s.offset), mem(s.user_md, user));
  };
  input(plan.in0, in0, ids[0]);
  input(plan.in1, in1, ids[1]);
  output(plan.out, out, ids[2]);
  if (bias) input(plan.in_bias, bias, DNNL_ARG_BIAS);
  if (dbias) output(plan.out_bias, dbias, DNNL_ARG_DIFF_BIAS);
  args[DNNL_ARG_SCRATCHPAD] = mem(plan.scratch_md, ws + plan.scratch_offset);
  plan.prim.execute(stream_, args);
  finish(plan.out, out);
  if (dbias) finish(plan.out_bias, dbias);
  stream_.wait();
}

void CpuBackend::conv_forward(ConvAlgo algo, const ConvProblem& p, const Tensor& x, const void* w,
                              const void* bias, const Tensor& y, float beta, void* workspace,
                              size_t workspace_bytes) {
  check_beta("conv_forward", beta);
  const ConvPlan& plan = conv_plan(ConvKind::kForward, algo, p, beta != 0.0f, bias != nullptr);
  check_workspace("conv_forward", workspace_bytes, plan.workspace, p);
  char* ws = static_cast<char*>(workspace);
  try {
    if (plan.im2col) {
      run_im2col(ConvKind::kForward, plan, p, &x, w, bias, nullptr, &y, nullptr, nullptr, beta, ws);
    } else {
      run_dnnl_conv(ConvKind::kForward, plan, ws, x.data, w, y.data, bias, nullptr);
    }
  } catch (const dnnl::error& e) {
    rethrow("conv_forward " + p.str(), e);
  }
}

void CpuBackend::conv_backward_data(ConvAlgo algo, const ConvProblem& p, const Tensor& dy,
                                    const void* w, const Tensor& dx, float beta, void* workspace,
                                    size_t workspace_bytes) {
  check_beta("conv_backward_data", beta);
  const ConvPlan& plan = conv_plan(ConvKind::kBackwardData, algo, p, beta != 0.0f, true);
  check_workspace("conv_backward_data", workspace_bytes, plan.workspace, p);
  char* ws = static_cast<char*>(workspace);
  try {
    if (plan.im2col) {
      run_im2col(ConvKind::kBackwardData, plan, p, nullptr, w, nullptr, &dy, &dx, nullptr, nullptr,
                 beta, ws);
    } else {
      run_dnnl_conv(ConvKind::kBackwardData, plan, ws, dy.data, w, dx.data, nullptr, nullptr);
    }
  } catch (const dnnl::error& e) {
    rethrow("conv_backward_data " + p.str(), e);
  }
}

void CpuBackend::conv_backward_filter(ConvAlgo algo, const ConvProblem& p, const Tensor& x,
                                      const Tensor& dy, float* dw, float* dbias, float beta,
                                      void* workspace, size_t workspace_bytes) {
  check_beta("conv_backward_filter", beta);
  const ConvPlan& plan =
      conv_plan(ConvKind::kBackwardFilter, algo, p, beta != 0.0f, dbias != nullptr);
  check_workspace("conv_backward_filter", workspace_bytes, plan.workspace, p);
  char* ws = static_cast<char*>(workspace);
  try {
    if (plan.im2col) {
      run_im2col(ConvKind::kBackwardFilter, plan, p, &x, nullptr, nullptr, &dy, nullptr, dw, dbias,
                 beta, ws);
    } else {
      run_dnnl_conv(ConvKind::kBackwardFilter, plan, ws, x.data, dy.data, dw, nullptr, dbias);
    }
  } catch (const dnnl::error& e) {
    rethrow("conv_backward_filter " + p.str(), e);
  }
}


}  // namespace vtrain::worker::cpu
