// CUDA backend: half convolutions as the engine configurations of cuDNN's
// graph (backend) API, beside the legacy API's algorithms (see "cuDNN
// graph-API convolution engines" in cuda_backend_impl.h).
#include "worker/device/cuda/cuda_conv_graph.h"

#include <array>
#include <cstdint>
#include <deque>
#include <optional>

namespace vtrain::worker::cuda {

namespace {

// Tensor ids in a convolution's operation graph and variant pack: the
// first operand, the second, the output (graph_execute's a, b, out).
constexpr int64_t kUidA = 1, kUidB = 2, kUidOut = 3;  // kUidA + 0, 1, 2

BackendDescriptor make_descriptor(cudnnBackendDescriptorType_t type, const std::string& what) {
  cudnnBackendDescriptor_t raw = nullptr;
  VTRAIN_CUDA_CHECK(cudnnBackendCreateDescriptor(type, &raw), what);
  return BackendDescriptor(raw);
}

void set_attribute(const BackendDescriptor& d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void* values,
                   const std::string& what) {
  VTRAIN_CUDA_CHECK(cudnnBackendSetAttribute(d.get(), name, type, count, values), what);
}

void finalize(const BackendDescriptor& d, const std::string& what) {
  VTRAIN_CUDA_CHECK(cudnnBackendFinalize(d.get()), what);
}

// The descriptors of `type` a descriptor-array attribute holds: up to
// `max` of them, or (max 0) as many as cuDNN says it has (asked with no
// array: the heuristics' results).
std::vector<BackendDescriptor> get_descriptors(const BackendDescriptor& d,
                                               cudnnBackendAttributeName_t name,
                                               cudnnBackendDescriptorType_t type, int64_t max,
                                               const std::string& what) {
  int64_t count = max;
  if (max == 0) {
    VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(d.get(), name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                               &count, nullptr),
                      what);
  }
  std::vector<BackendDescriptor> out;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    out.push_back(make_descriptor(type, what));
    raw.push_back(out.back().get());
  }
  int64_t returned = 0;
  if (count > 0) {
    VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(d.get(), name, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                               count, &returned, raw.data()),
                      what);
  }
  // The count cuDNN returns is the attribute's, which may exceed what it
  // wrote: keep no more than was asked for.
  out.resize(static_cast<size_t>(std::clamp<int64_t>(returned, 0, count)));
  return out;
}

// An enum-valued array attribute (an engine's numerical or behavior notes).
template <typename Note>
std::vector<Note> get_notes(const BackendDescriptor& engine, cudnnBackendAttributeName_t name,
                            cudnnBackendAttributeType_t type, const std::string& what) {
  std::array<Note, 32> notes{};
  int64_t count = 0;
  VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(engine.get(), name, type,
                                             static_cast<int64_t>(notes.size()), &count,
                                             notes.data()),
                    what);
  const int64_t kept = std::clamp<int64_t>(count, 0, static_cast<int64_t>(notes.size()));
  return std::vector<Note>(notes.begin(), notes.begin() + kept);
}

// The largest power of two up to 16 that divides `bytes`.
int64_t alignment_of(uint64_t bytes) {
  int64_t a = 1;
  while (a < 16 && bytes % static_cast<uint64_t>(2 * a) == 0) a *= 2;
  return a;
}

struct GraphTensor {
  std::array<int64_t, 4> dims;  // n, c, h, w (filters: k, c, r, s)
  std::array<int64_t, 4> strides;
};

// dims in NCHW order with the strides of `layout` (NHWC for activations,
// KRSC for filters, as cuDNN's tensor-core kernels want them).
GraphTensor graph_tensor(const Shape& s, Layout layout) {
  if (layout == Layout::kNhwc) {
    return {{s.n, s.c, s.h, s.w}, {s.h * s.w * s.c, 1, s.w * s.c, s.c}};
  }
  return {{s.n, s.c, s.h, s.w}, {s.c * s.h * s.w, s.h * s.w, s.w, 1}};
}

BackendDescriptor make_tensor(int64_t uid, const GraphTensor& t, DataType type, int64_t alignment,
                              const std::string& what) {
  BackendDescriptor d = make_descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
  const cudnnDataType_t data_type = cudnn_type(type);
  set_attribute(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &data_type, what);
  set_attribute(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data(), what);
  set_attribute(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data(), what);
  set_attribute(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
  set_attribute(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
  finalize(d, what);
  return d;
}

// One convolution of `kind` on p in `layout`, its tensors in p's type and
// computing in `compute`, out = alpha * conv + beta * out: an operation
// graph of one node. The descriptors the graph refers to are kept in
// `keep` (cuDNN holds no references of its own; a deque, so that the
// references taken here stay valid as it grows).
BackendDescriptor make_graph(const GraphTarget& target, ConvKind kind, const ConvProblem& p,
                             Layout layout, cudnnDataType_t compute, float beta,
                             int64_t alignment, std::deque<BackendDescriptor>& keep,
                             const std::string& what) {
  // The operands a, b, out (uids 1, 2, 3: graph_execute's order) of each
  // kind: x, w, y; dy, w, dx; x, dy, dw. The filters' alignment is 16.
  struct Operand {
    Shape shape;
    int64_t alignment;
  };
  const Operand x{p.x.shape, alignment}, w{p.weight_shape(), 16}, y{p.y.shape, alignment};
  const Operand* operands[3] = {&x, &w, &y};
  if (kind == ConvKind::kBackwardData) operands[0] = &y, operands[2] = &x;
  if (kind == ConvKind::kBackwardFilter) operands[1] = &y, operands[2] = &w;
  cudnnBackendDescriptor_t tensors[3] = {};
  for (int i = 0; i < 3; ++i) {
    tensors[i] = keep.emplace_back(make_tensor(kUidA + i, graph_tensor(operands[i]->shape, layout),
                                               p.x.dtype, operands[i]->alignment, what))
                     .get();
  }

  const BackendDescriptor& conv =
      keep.emplace_back(make_descriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, what));
  const int64_t dims = 2;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::array<int64_t, 2> dilation{1, 1}, stride{p.window.stride_h, p.window.stride_w},
      pad{p.window.pad_h, p.window.pad_w};
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, what);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode,
                what);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims, what);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation.data(), what);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data(),
                what);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data(), what);
  set_attribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data(), what);
  finalize(conv, what);

  struct OpAttributes {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t alpha, beta, conv, a, b, out;
  };
  const OpAttributes attrs =
      kind == ConvKind::kForward
          ? OpAttributes{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y}
      : kind == ConvKind::kBackwardData
          ? OpAttributes{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX}
          : OpAttributes{CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                         CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW};
  const BackendDescriptor& op = keep.emplace_back(make_descriptor(attrs.type, what));
  const float one = 1.0f;
  const cudnnBackendDescriptor_t conv_raw = conv.get();
  set_attribute(op, attrs.alpha, CUDNN_TYPE_FLOAT, 1, &one, what);
  set_attribute(op, attrs.beta, CUDNN_TYPE_FLOAT, 1, &beta, what);
  set_attribute(op, attrs.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv_raw, what);
  set_attribute(op, attrs.a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors[0], what);
  set_attribute(op, attrs.b, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors[1], what);
  set_attribute(op, attrs.out, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors[2], what);
  finalize(op, what);

  BackendDescriptor graph = make_descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what);
  const cudnnBackendDescriptor_t op_raw = op.get();
  set_attribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op_raw,
                what);
  if (target.handle) {
    set_attribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle,
                  what);
  }
  finalize(graph, what);
  return graph;
}

// The engine configuration (global index, knobs) on `graph`, finalized as
// an execution plan; null with cuDNN's reason where it does not finalize.
// The descriptors made on the way join out.parts.
void make_plan(const GraphTarget& target, const BackendDescriptor& graph, const GraphEngine& e,
               GraphPlan& out, const std::string& what) {
  const cudnnBackendDescriptor_t graph_raw = graph.get();
  const BackendDescriptor& engine =
      out.parts.emplace_back(make_descriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, what));
  set_attribute(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                &graph_raw, what);
  set_attribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &e.global_index, what);
  if (target.device) {
    set_attribute(engine, CUDNN_ATTR_ENGINE_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &target.device, what);
  }
  if (cudnnStatus_t s = cudnnBackendFinalize(engine.get()); s != CUDNN_STATUS_SUCCESS) {
    out.refused = std::string("engine: ") + cudnnGetErrorString(s);
    return;
  }
  std::vector<cudnnBackendDescriptor_t> knob_raw;
  for (const auto& [type, value] : e.knobs) {
    const BackendDescriptor& k =
        out.parts.emplace_back(make_descriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, what));
    const auto knob_type = static_cast<cudnnBackendKnobType_t>(type);
    set_attribute(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &knob_type, what);
    set_attribute(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value, what);
    finalize(k, what);
    knob_raw.push_back(k.get());
  }
  const BackendDescriptor& config =
      out.parts.emplace_back(make_descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what));
  const cudnnBackendDescriptor_t engine_raw = engine.get();
  set_attribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine_raw,
                what);
  if (!knob_raw.empty()) {
    set_attribute(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                  static_cast<int64_t>(knob_raw.size()), knob_raw.data(), what);
  }
  if (cudnnStatus_t s = cudnnBackendFinalize(config.get()); s != CUDNN_STATUS_SUCCESS) {
    out.refused = std::string("engine configuration: ") + cudnnGetErrorString(s);
    return;
  }
  BackendDescriptor plan = make_descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, what);
  const cudnnBackendDescriptor_t config_raw = config.get();
  if (target.handle) {
    set_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle,
                  what);
  }
  set_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                &config_raw, what);
  if (cudnnStatus_t s = cudnnBackendFinalize(plan.get()); s != CUDNN_STATUS_SUCCESS) {
    out.refused = std::string("execution plan: ") + cudnnGetErrorString(s);
    return;
  }
  int64_t workspace = 0, count = 0;
  VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, &count, &workspace),
                    what);
  out.plan = std::move(plan);
  out.workspace = static_cast<size_t>(workspace);
}

// The bytes every activation address of p is a multiple of: the pool's
// blocks are 256-byte aligned and micro-batches start at whole samples.
int64_t problem_alignment(const ConvProblem& p) {
  const uint64_t elem = element_bytes(p.x.dtype);
  const uint64_t x_sample = static_cast<uint64_t>(p.x.shape.c * p.x.shape.h * p.x.shape.w) * elem;
  const uint64_t y_sample = static_cast<uint64_t>(p.y.shape.c * p.y.shape.h * p.y.shape.w) * elem;
  return std::min(alignment_of(x_sample), alignment_of(y_sample));
}

std::string engine_name(int64_t global_index, const std::vector<std::pair<int64_t, int64_t>>& knobs,
                        const char* suffix) {
  std::string name = "eng" + std::to_string(global_index);
  for (const auto& [type, value] : knobs) {
    name += "_k" + std::to_string(type) + "=" + std::to_string(value);
  }
  return name + suffix;
}

// The engine configuration `config` (a heuristic's result) as a registry
// entry, or nullopt for one left out: runtime compilation, or (f32
// compute) reductions in half.
std::optional<GraphEngine> engine_of(const BackendDescriptor& config, ConvKind kind,
                                     const ConvVariantInfo& variant, const std::string& what) {
  std::vector<BackendDescriptor> engines = get_descriptors(
      config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1, what);
  if (engines.empty()) return std::nullopt;
  const BackendDescriptor& engine = engines.front();
  const auto behavior = get_notes<cudnnBackendBehaviorNote_t>(
      engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, what);
  if (std::find(behavior.begin(), behavior.end(), CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) !=
      behavior.end()) {
    return std::nullopt;
  }
  const auto numerics = get_notes<cudnnBackendNumericalNote_t>(
      engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, what);
  if (variant.compute == CUDNN_DATA_FLOAT &&
      std::find(numerics.begin(), numerics.end(),
                CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) != numerics.end()) {
    return std::nullopt;
  }
  GraphEngine e;
  e.kind = kind;
  e.variant = &variant;
  int64_t count = 0;
  VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                             CUDNN_TYPE_INT64, 1, &count, &e.global_index),
                    what);
  for (const BackendDescriptor& knob :
       get_descriptors(config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                       CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, CUDNN_KNOB_TYPE_COUNTS, what)) {
    cudnnBackendKnobType_t type{};
    int64_t value = 0;
    VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(knob.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                               CUDNN_TYPE_KNOB_TYPE, 1, &count, &type),
                      what);
    VTRAIN_CUDA_CHECK(cudnnBackendGetAttribute(knob.get(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                               CUDNN_TYPE_INT64, 1, &count, &value),
                      what);
    e.knobs.emplace_back(static_cast<int64_t>(type), value);
  }
  e.name = engine_name(e.global_index, e.knobs, variant.suffix);
  return e;
}

}  // namespace

std::vector<GraphEngine> ranked_graph_engines(const GraphTarget& target, ConvKind kind,
                                              const ConvProblem& p,
                                              const ConvVariantInfo& variant) {
  const std::string what = std::string(conv_kind_name(kind)) + " graph engines for " + p.str() +
                           variant.suffix;
  std::deque<BackendDescriptor> keep;
  BackendDescriptor graph = make_graph(target, kind, p, conv_layout(kind, p), variant.compute,
                                       0.0f, problem_alignment(p), keep, what);
  BackendDescriptor heuristics = make_descriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what);
  const cudnnBackendDescriptor_t graph_raw = graph.get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                1, &graph_raw, what);
  set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, what);
  if (target.device) {
    set_attribute(heuristics, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                  &target.device, what);
  }
  finalize(heuristics, what);
  std::vector<GraphEngine> out;
  for (const BackendDescriptor& config :
       get_descriptors(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                       CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, 0, what)) {
    try {
      if (std::optional<GraphEngine> e = engine_of(config, kind, variant, what)) {
        out.push_back(std::move(*e));
      }
    } catch (const BackendError&) {
      // A result whose attributes cannot be read: left out.
    }
  }
  return out;
}

GraphPlan graph_plan_for(const GraphTarget& target, ConvKind kind, const ConvProblem& p,
                         const GraphEngine& e, float beta) {
  const std::string what = std::string(conv_kind_name(kind)) + " " + e.name + " on " + p.str();
  GraphPlan plan;
  plan.alignment = problem_alignment(p);
  const BackendDescriptor& graph = plan.parts.emplace_back(
      make_graph(target, kind, p, conv_layout(kind, p), e.variant->compute, beta, plan.alignment,
                 plan.parts, what));
  make_plan(target, graph, e, plan, what);
  return plan;
}

std::vector<ConvAlgoInfo> CudaBackend::graph_algorithms(ConvKind kind, const ConvProblem& p) {
  std::vector<ConvAlgoInfo> algos;
  if (!cudnn_graph_ || p.x.dtype == DataType::kF32) return algos;
  for (const ConvVariantInfo& variant : kConvVariants) {
    if (variant.tensors != p.x.dtype) continue;
    std::vector<GraphEngine> ranked;
    try {
      ranked = ranked_graph_engines({.handle = cudnn_.get()}, kind, p, variant);
    } catch (const BackendError&) {
      continue;  // the graph API failed for this problem: the legacy algorithms stand
    }
    int offered = 0;
    for (GraphEngine& e : ranked) {
      if (offered == graph_engines_per_variant_) break;
      auto known = std::find_if(graph_engines_.begin(), graph_engines_.end(),
                                [&](const GraphEngine& g) {
                                  return g.kind == kind && g.name == e.name;
                                });
      if (known == graph_engines_.end()) {
        graph_engines_.push_back(std::move(e));
        known = graph_engines_.end() - 1;
      }
      const ConvAlgo algo = kGraphAlgoBase + static_cast<ConvAlgo>(known - graph_engines_.begin());
      if (std::any_of(algos.begin(), algos.end(),
                      [&](const ConvAlgoInfo& a) { return a.algo == algo; })) {
        continue;
      }
      try {
        algos.push_back({algo, known->name, conv_workspace(kind, algo, p, false)});
        ++offered;
      } catch (const BackendError&) {
        // Ranked by the heuristic, but its plan does not finalize here (for
        // beta 0 or 1): left out.
      }
    }
  }
  return algos;
}

const GraphEngine* CudaBackend::graph_engine(ConvKind kind, ConvAlgo algo) const {
  if (algo < kGraphAlgoBase) return nullptr;
  const auto i = static_cast<size_t>(algo - kGraphAlgoBase);
  if (i >= graph_engines_.size() || graph_engines_[i].kind != kind) return nullptr;
  return &graph_engines_[i];
}

const GraphPlan& CudaBackend::graph_plan(ConvKind kind, ConvAlgo algo, const ConvProblem& p,
                                         float beta) {
  const GraphEngine* e = graph_engine(kind, algo);
  if (e == nullptr) {
    throw BackendError("cuda backend: unknown " + std::string(conv_kind_name(kind)) +
                       " convolution algorithm id " + std::to_string(algo));
  }
  if (e->variant->tensors != p.x.dtype) {
    throw BackendError("cuda backend: " + std::string(conv_kind_name(kind)) + " algorithm " +
                       e->name + " runs " + dtype_name(e->variant->tensors) + " tensors, not " +
                       dtype_name(p.x.dtype) + " ones (" + p.str() + ")");
  }
  const Layout layout = conv_layout(kind, p);
  const std::string key = std::to_string(static_cast<int>(kind)) + "/" + std::to_string(algo) +
                          "/" + p.str() + "/" + layout_name(layout) + "/" +
                          std::to_string(static_cast<int>(beta));
  auto it = graph_plans_.find(key);
  if (it == graph_plans_.end()) {
    GraphPlan plan = graph_plan_for({.handle = cudnn_.get()}, kind, p, *e, beta);
    it = graph_plans_.emplace(key, std::move(plan)).first;
  }
  if (!it->second.plan) {
    throw BackendError("cuda backend: " + std::string(conv_kind_name(kind)) + " algorithm " +
                       e->name + " is not available for " + p.str() + ": cuDNN's " +
                       it->second.refused);
  }
  return it->second;
}

size_t CudaBackend::graph_workspace(ConvKind kind, ConvAlgo algo, const ConvProblem& p) {
  size_t bytes = graph_plan(kind, algo, p, 0.0f).workspace;
  // A weight gradient is always computed with beta 0 into the staging.
  if (kind != ConvKind::kBackwardFilter) {
    bytes = std::max(bytes, graph_plan(kind, algo, p, 1.0f).workspace);
  }
  return bytes;
}

void CudaBackend::graph_execute(ConvKind kind, ConvAlgo algo, const ConvProblem& p, float beta,
                                const void* a, const void* b, void* out, void* workspace,
                                size_t workspace_bytes) {
  const GraphPlan& plan = graph_plan(kind, algo, p, beta);
  const std::string what = std::string(conv_kind_name(kind)) + " " +
                           graph_engine(kind, algo)->name + " on " + p.str();
  // The filters' alignment is 16 (the half weights start each layer
  // 128-byte aligned, KRSC copies and staged gradients sit in the
  // workspace); the activations' is the problem's.
  const auto misaligned = [](const void* ptr, int64_t alignment) {
    return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(alignment) != 0;
  };
  const void* filters = kind == ConvKind::kBackwardFilter ? out : b;
  const void* activations[] = {a, kind == ConvKind::kBackwardFilter ? b : out};
  if (misaligned(filters, 16) || misaligned(activations[0], plan.alignment) ||
      misaligned(activations[1], plan.alignment) || misaligned(workspace, 16)) {
    throw BackendError("cuda backend: " + what + ": an operand's address is not aligned to " +
                       std::to_string(plan.alignment) + " bytes (filters and workspace: 16)");
  }
  if (workspace_bytes < plan.workspace) {
    throw BackendError("cuda backend: " + what + " needs " + std::to_string(plan.workspace) +
                       " workspace bytes, got " + std::to_string(workspace_bytes));
  }
  BackendDescriptor pack = make_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what);
  const std::array<int64_t, 3> uids{kUidA, kUidB, kUidOut};
  const std::array<void*, 3> pointers{const_cast<void*>(a), const_cast<void*>(b), out};
  set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data(), what);
  set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3,
                pointers.data(), what);
  set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace, what);
  finalize(pack, what);
  VTRAIN_CUDA_CHECK(cudnnBackendExecute(cudnn_.get(), plan.plan.get(), pack.get()), what);
}

}  // namespace vtrain::worker::cuda
