#include "worker/engine/network.h"

#include "balancer/workspace_plan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "memory/dynamic_policy.h"
#include "memory/memory_error.h"
#include "memory/simulator.h"
#include "worker/engine/op_scratch.h"

namespace vtrain::worker {
namespace {

// splitmix64: a small, portable generator, so initial weights are identical
// on every platform and rank.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [-bound, bound).
  float uniform(float bound) {
    const double u = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>((2.0 * u - 1.0) * bound);
  }

 private:
  uint64_t state_;
};

Tensor view(const TensorDesc& max_desc, float* data, int64_t n) {
  Tensor t{max_desc, data};
  t.desc.shape.n = n;
  return t;
}

}  // namespace

void run_conv_kernel(Backend& backend, ConvKind kind, const ConvProblem& p,
                     std::span<const ConvStep> steps, const ConvOperands& o, float beta,
                     void* workspace, size_t workspace_bytes) {
  if (steps.empty()) throw BackendError(std::string(conv_kind_name(kind)) + ": no calls");
  const int64_t n = p.x.shape.n;
  int64_t first = 0;
  for (size_t call = 0; first < n; ++call) {
    const ConvStep& step = steps[call % steps.size()];
    if (step.size < 1) {
      throw BackendError(std::string(conv_kind_name(kind)) + ": a call of " +
                         std::to_string(step.size) + " images");
    }
    const int64_t m = std::min(step.size, n - first);
    const ConvProblem q = p.with_batch(m);
    const bool accumulate = beta != 0.0f || (kind == ConvKind::kBackwardFilter && first > 0);
    const size_t need = backend.conv_workspace(kind, step.algo, q, accumulate);
    if (need > workspace_bytes) {
      throw BackendError(std::string(conv_kind_name(kind)) + " " + q.str() + " with " +
                         backend.conv_algorithm_name(kind, step.algo) + " needs " +
                         std::to_string(need) + " bytes of workspace, its segment has " +
                         std::to_string(workspace_bytes));
    }
    switch (kind) {
      case ConvKind::kForward:
        backend.conv_forward(step.algo, q, o.x.samples(first, m), o.w, o.bias,
                             o.y.samples(first, m), beta, workspace, workspace_bytes);
        break;
      case ConvKind::kBackwardData:
        backend.conv_backward_data(step.algo, q, o.dy.samples(first, m), o.w,
                                   o.dx.samples(first, m), beta, workspace, workspace_bytes);
        break;
      case ConvKind::kBackwardFilter:
        backend.conv_backward_filter(step.algo, q, o.x.samples(first, m), o.dy.samples(first, m),
                                     o.dw, o.dbias, first == 0 ? beta : 1.0f, workspace,
                                     workspace_bytes);
        break;
    }
    first += m;
  }
}

// What a layer sees during one forward or backward call.
struct StepContext {
  Backend& backend;
  int64_t n;
  std::vector<Tensor> in;   // input activations
  Tensor out;               // output activation
  Tensor dout;              // gradient of the output (backward)
  void* workspace;
  size_t workspace_bytes;
  // Writes the gradient of input i through `op(dst, beta)`. Ops that can
  // accumulate get beta = 1 when the gradient already holds a value from
  // another consumer; the others write a scratch tensor that is added.
  std::function<void(int, bool, const std::function<void(const Tensor&, float)>&)> emit_grad;
  std::function<bool(int)> needs_grad;
  std::function<Tensor(const Tensor&)> scratch_like;  // a scratch tensor with like's descriptor
  std::function<void()> gradients_ready;  // the layer's parameter gradients are final
};

struct Network::Layer {
  explicit Layer(const LayerSpec& s) : spec(s) {}
  virtual ~Layer() = default;
  virtual int64_t param_count() const { return 0; }
  virtual int64_t buffer_count() const { return 0; }
  virtual void bind(float* params, float* grads, float* buffers) {}
  virtual void init(Rng& rng, Backend& backend) {}
  virtual size_t state_bytes() const { return 0; }  // device memory kept from forward to backward
  virtual void bind_state(void* state) {}
  virtual void forward(StepContext& ctx, bool training) = 0;
  virtual void backward(StepContext& ctx) = 0;
  // The memory part's view of backward(): what it reads and how it writes
  // input gradients (see memory::LayerNode). Beside each backward() so that
  // the two change together; the use-after-release tests (poisoned pool)
  // check that they agree. Default: reads nothing, may accumulate.
  virtual void describe_backward(memory::LayerNode& node) const {}
  virtual std::string algorithms(Backend& backend) const { return ""; }

  LayerSpec spec;
  float* params = nullptr;
  float* grads = nullptr;
};

namespace {

using Layer = Network::Layer;

void upload_floats(Backend& backend, const std::vector<float>& host, float* device) {
  if (host.empty()) return;
  backend.upload(host.data(), Tensor{{{static_cast<int64_t>(host.size()), 1, 1, 1}}, device});
}

std::vector<float> download_floats(Backend& backend, const float* device, int64_t count) {
  std::vector<float> host(static_cast<size_t>(count));
  if (count > 0) {
    backend.download(Tensor{{{count, 1, 1, 1}}, const_cast<float*>(device)}, host.data());
  }
  return host;
}

class InputLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(StepContext&, bool) override {}
  void backward(StepContext&) override {}
};

class ConvLayer final : public Layer {
 public:
  ConvLayer(const LayerSpec& s, Backend& backend, const TensorDesc& x, const TensorDesc& y,
            const std::string& algorithm, const ConvLayerExecution* execution,
            std::vector<ConvKind> kernels)
      : Layer(s), problem_(conv_problem(s, x, y)), kernels_(std::move(kernels)) {
    if (execution) {
      plan(backend, *execution);
      return;
    }
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      auto& options = candidates_[static_cast<int>(kind)];
      options = backend.conv_algorithms(kind, problem_, accumulate(kind));
      if (options.empty()) {
        throw std::runtime_error("layer '" + s.name + "': no " + conv_kind_name(kind) +
                                 " convolution algorithm for " + problem_.str());
      }
      // A named algorithm applies where the backend offers it; elsewhere,
      // and for "auto" until tune() has measured, the backend's first one.
      auto it = std::find_if(options.begin(), options.end(),
                             [&](const ConvAlgoInfo& a) { return a.name == algorithm; });
      choose(kind, it != options.end() ? *it : options.front());
      if (algorithm != "auto") options = {it != options.end() ? *it : options.front()};
    }
  }
  // Drops the candidates that need more workspace than `bytes` (what the
  // device has room for), keeping at least each kind's smallest, and
  // re-chooses where the choice was dropped.
  void keep_candidates_within(size_t bytes) {
    for (int k = 0; k < 3; ++k) {
      auto& options = candidates_[k];
      if (options.empty()) continue;
      const ConvAlgoInfo smallest =
          *std::min_element(options.begin(), options.end(), [](const auto& a, const auto& b) {
            return a.workspace_bytes < b.workspace_bytes;
          });
      std::erase_if(options, [&](const ConvAlgoInfo& a) { return a.workspace_bytes > bytes; });
      if (options.empty()) options.push_back(smallest);
      if (std::none_of(options.begin(), options.end(),
                       [&](const ConvAlgoInfo& a) { return a.algo == chosen_[k].algo; })) {
        chosen_[k] = options.front();
      }
    }
  }
  // Workspace that every candidate algorithm fits in (for tuning).
  size_t candidate_workspace() const {
    size_t bytes = 0;
    for (const auto& options : candidates_) {
      for (const ConvAlgoInfo& a : options) bytes = std::max(bytes, a.workspace_bytes);
    }
    return bytes;
  }
  // Times every candidate of every kind the layer runs on the network's own
  // buffers and keeps the fastest (the cudnnFind approach).
  void tune(Backend& backend, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dx,
            void* workspace, size_t workspace_bytes) {
    for (ConvKind kind : kernels()) {
      auto& options = candidates_[static_cast<int>(kind)];
      if (options.size() < 2) continue;
      double best = 0;
      for (const ConvAlgoInfo& a : options) {
        auto run = [&] {
          switch (kind) {
            case ConvKind::kForward:
              backend.conv_forward(a.algo, problem_, x, params, bias(params), y, 0.0f, workspace,
                                   workspace_bytes);
              break;
            case ConvKind::kBackwardData:
              backend.conv_backward_data(a.algo, problem_, dy, params, dx, 0.0f, workspace,
                                         workspace_bytes);
              break;
            case ConvKind::kBackwardFilter:
              backend.conv_backward_filter(a.algo, problem_, x, dy, grads, bias(grads), 0.0f,
                                           workspace, workspace_bytes);
              break;
          }
          backend.synchronize(StreamKind::kCompute);
        };
        run();  // creates the primitive, warms caches
        double fastest = 0;
        for (int rep = 0; rep < 2; ++rep) {
          const auto start = std::chrono::steady_clock::now();
          run();
          const double t =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          fastest = rep == 0 ? t : std::min(fastest, t);
        }
        seconds_[static_cast<int>(kind)][a.name] = fastest;
        if (&a == &options.front() || fastest < best) {
          best = fastest;
          choose(kind, a);
        }
      }
    }
  }
  int64_t param_count() const override {
    return problem_.weight_shape().elements() + (spec.bias ? spec.out : 0);
  }
  void bind(float* p, float* g, float*) override {
    params = p;
    grads = g;
  }
  void init(Rng& rng, Backend& backend) override {
    const Shape w = problem_.weight_shape();
    const float bound = 1.0f / std::sqrt(static_cast<float>(w.per_sample()));
    std::vector<float> host(static_cast<size_t>(param_count()));
    for (float& v : host) v = rng.uniform(bound);
    upload_floats(backend, host, params);
  }
  // For the memory part: one kernel's workspace with its chosen algorithm
  // (0 when planned: its segment lies in the plan's buffer), the kernel's
  // candidates with their tuned seconds (0 where not timed), and a choice
  // among them by name (the dynamic policy's downgrade).
  bool planned() const { return planned_; }
  size_t kernel_workspace(ConvKind kind) const {
    return planned_ ? 0 : chosen_[static_cast<int>(kind)].workspace_bytes;
  }
  // The kernels a training step runs (conv_kernels_of()).
  const std::vector<ConvKind>& kernels() const { return kernels_; }
  bool runs(ConvKind kind) const {
    return std::find(kernels_.begin(), kernels_.end(), kind) != kernels_.end();
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = !planned_;  // see backward()
    node.forward_workspace = kernel_workspace(ConvKind::kForward);
    for (ConvKind kind : kernels()) {
      if (kind != ConvKind::kForward) {
        node.backward_workspace = std::max(node.backward_workspace, kernel_workspace(kind));
      }
    }
  }
  std::vector<std::pair<ConvAlgoInfo, double>> timed_candidates(ConvKind kind) const {
    std::vector<std::pair<ConvAlgoInfo, double>> out;
    const auto& seconds = seconds_[static_cast<int>(kind)];
    for (const ConvAlgoInfo& a : candidates_[static_cast<int>(kind)]) {
      auto it = seconds.find(a.name);
      out.push_back({a, it == seconds.end() ? 0.0 : it->second});
    }
    return out;
  }
  void choose_algorithm(ConvKind kind, const std::string& name) {
    for (const ConvAlgoInfo& a : candidates_[static_cast<int>(kind)]) {
      if (a.name == name) return choose(kind, a);
    }
    throw BackendError("layer '" + spec.name + "': no " + conv_kind_name(kind) +
                       " candidate named '" + name + "'");
  }
  void forward(StepContext& ctx, bool) override {
    ConvOperands o;
    o.x = ctx.in[0];
    o.y = ctx.out;
    o.w = params;
    o.bias = bias(params);
    run(ctx, ConvKind::kForward, o, 0.0f);
  }
  void backward(StepContext& ctx) override {
    ConvOperands o;
    o.x = ctx.in[0];
    o.dy = ctx.dout;
    o.w = params;
    o.dw = grads;
    o.dbias = bias(grads);
    run(ctx, ConvKind::kBackwardFilter, o, 0.0f);
    ctx.gradients_ready();
    // Planned kernels were measured writing dx (beta 0): a second consumer's
    // share is added from a scratch tensor instead.
    ctx.emit_grad(0, !planned_, [&](const Tensor& dx, float beta) {
      o.dx = dx;
      run(ctx, ConvKind::kBackwardData, o, beta);
    });
  }
  std::string algorithms(Backend& backend) const override {
    std::string out;
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      if (!out.empty()) out += " ";
      out += std::string(conv_kind_name(kind)) + "=";
      if (!planned_) {
        out += backend.conv_algorithm_name(kind, algo(kind));
        continue;
      }
      std::vector<balancer::MicroBatch> calls;
      for (const ConvStep& step : steps_[static_cast<int>(kind)]) {
        calls.push_back({backend.conv_algorithm_name(kind, step.algo), step.size});
      }
      out += calls.empty() ? "-" : "[" + balancer::describe_calls(calls) + "]";
    }
    return out;
  }

 private:
  // Backward-data may have to add into a gradient another consumer wrote.
  static bool accumulate(ConvKind kind) { return kind == ConvKind::kBackwardData; }
  ConvAlgo algo(ConvKind kind) const { return chosen_[static_cast<int>(kind)].algo; }
  void choose(ConvKind kind, const ConvAlgoInfo& a) { chosen_[static_cast<int>(kind)] = a; }
  float* bias(float* base) const {
    return spec.bias ? base + problem_.weight_shape().elements() : nullptr;
  }

  // Runs one kernel: undivided with the chosen algorithm in the shared
  // workspace, or as the plan's calls in the kernel's segment of it.
  void run(StepContext& ctx, ConvKind kind, const ConvOperands& o, float beta) {
    const ConvProblem p = problem_.with_batch(ctx.n);
    const int k = static_cast<int>(kind);
    if (!planned_) {
      const ConvStep whole{algo(kind), ctx.n};
      run_conv_kernel(ctx.backend, kind, p, {&whole, 1}, o, beta, ctx.workspace,
                      ctx.workspace_bytes);
      return;
    }
    run_conv_kernel(ctx.backend, kind, p, steps_[k], o, beta,
                    static_cast<char*>(ctx.workspace) + segment_[k].first, segment_[k].second);
  }
  // Resolves a plan's algorithm names and checks its segments and sizes.
  // Where the input is the data backward-data never runs, and the plan may
  // omit it.
  void plan(Backend& backend, const ConvLayerExecution& execution) {
    planned_ = true;
    for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
      const int k = static_cast<int>(kind);
      const ConvKernelExecution& e = execution.kernels[k];
      const std::string where = "layer '" + spec.name + "' " + conv_kind_name(kind);
      if (!runs(kind) && e.calls.empty()) {
        choose(kind, {0, "-", 0});
        continue;
      }
      if (e.calls.empty()) throw BackendError(where + ": the plan gives no calls");
      int64_t total = 0;
      for (const ConvCall& call : e.calls) {
        if (call.size < 1 || call.size > problem_.x.shape.n) {
          throw BackendError(where + ": a call of " + std::to_string(call.size) +
                             " images (expected 1.." + std::to_string(problem_.x.shape.n) + ")");
        }
        const auto offered = backend.conv_algorithms(kind, problem_.with_batch(call.size),
                                                     accumulate(kind));
        auto it = std::find_if(offered.begin(), offered.end(),
                               [&](const ConvAlgoInfo& a) { return a.name == call.algorithm; });
        if (it == offered.end()) {
          std::string names;
          for (const ConvAlgoInfo& a : offered) names += (names.empty() ? "" : ", ") + a.name;
          throw BackendError(where + ": algorithm '" + call.algorithm + "' is not offered for " +
                             problem_.with_batch(call.size).str() + " (offered: " + names + ")");
        }
        steps_[k].push_back({it->algo, call.size});
        total += call.size;
      }
      if (total < 1) throw BackendError(where + ": the plan's calls cover no images");
      segment_[k] = {e.workspace_offset, e.workspace_bytes};
      choose(kind, {steps_[k].front().algo, e.calls.front().algorithm, e.workspace_bytes});
    }
  }

  ConvProblem problem_;
  std::vector<ConvKind> kernels_;  // the kinds a step runs
  std::vector<ConvAlgoInfo> candidates_[3];
  ConvAlgoInfo chosen_[3];
  std::map<std::string, double> seconds_[3];      // tuned time per candidate, per kind
  bool planned_ = false;
  std::vector<ConvStep> steps_[3];                // planned calls per kind
  std::pair<uint64_t, uint64_t> segment_[3]{};    // planned (offset, bytes) per kind
};

class ReluLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(StepContext& ctx, bool) override { ctx.backend.relu_forward(ctx.in[0], ctx.out); }
  void backward(StepContext& ctx) override {
    ctx.emit_grad(0, false, [&](const Tensor& dx, float) {
      ctx.backend.relu_backward(ctx.out, ctx.dout, dx);
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_output = true;
    node.backward_accumulates = false;
  }
};

class PoolLayer final : public Layer {
 public:
  PoolLayer(const LayerSpec& s, const TensorDesc& x, const TensorDesc& y)
      : Layer(s), params_(pool_params(s)), x_(x), y_(y) {}
  size_t state_bytes() const override { return state_bytes_; }
  void measure_state(Backend& backend) { state_bytes_ = backend.pooling_state_bytes(params_, x_, y_); }
  void bind_state(void* state) override { state_ = state; }
  void forward(StepContext& ctx, bool) override {
    ctx.backend.pooling_forward(params_, ctx.in[0], ctx.out, state_);
  }
  void backward(StepContext& ctx) override {
    ctx.emit_grad(0, false, [&](const Tensor& dx, float) {
      ctx.backend.pooling_backward(params_, ctx.in[0], ctx.out, ctx.dout, dx, state_);
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = node.backward_reads_output = true;
    node.backward_accumulates = false;
  }

 private:
  PoolParams params_;
  TensorDesc x_, y_;
  size_t state_bytes_ = 0;
  void* state_ = nullptr;
};

class FcLayer final : public Layer {
 public:
  FcLayer(const LayerSpec& s, const Shape& x) : Layer(s), in_(x.per_sample()) {}
  int64_t param_count() const override { return spec.out * in_ + (spec.bias ? spec.out : 0); }
  void bind(float* p, float* g, float*) override {
    params = p;
    grads = g;
  }
  void init(Rng& rng, Backend& backend) override {
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
    std::vector<float> host(static_cast<size_t>(param_count()));
    for (float& v : host) v = rng.uniform(bound);
    upload_floats(backend, host, params);
  }
  void forward(StepContext& ctx, bool) override {
    ctx.backend.inner_product_forward(ctx.in[0], params, bias(params), ctx.out);
  }
  void backward(StepContext& ctx) override {
    ctx.backend.inner_product_backward_weights(ctx.in[0], ctx.dout, grads, bias(grads), 0.0f);
    ctx.gradients_ready();
    ctx.emit_grad(0, false, [&](const Tensor& dx, float) {
      ctx.backend.inner_product_backward_data(ctx.dout, params, dx);
    });
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = false;
  }

 private:
  float* bias(float* base) const { return spec.bias ? base + spec.out * in_ : nullptr; }
  int64_t in_;
};

class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(const LayerSpec& s, int64_t channels) : Layer(s), c_(channels) {}
  int64_t param_count() const override { return 2 * c_; }   // gamma, beta
  int64_t buffer_count() const override { return 2 * c_; }  // running mean, running var
  void bind(float* p, float* g, float* b) override {
    params = p;
    grads = g;
    running_ = b;
  }
  size_t state_bytes() const override { return 2 * c_ * sizeof(float); }  // batch mean, var
  void bind_state(void* state) override { saved_ = static_cast<float*>(state); }
  void init(Rng&, Backend& backend) override {
    std::vector<float> ss(2 * c_, 0.0f), running(2 * c_, 0.0f);
    std::fill(ss.begin(), ss.begin() + c_, 1.0f);
    std::fill(running.begin() + c_, running.end(), 1.0f);
    upload_floats(backend, ss, params);
    upload_floats(backend, running, running_);
  }
  void forward(StepContext& ctx, bool training) override {
    if (training) {
      ctx.backend.batch_norm_forward_training(ctx.in[0], ctx.out, params, saved_, saved_ + c_,
                                              running_, running_ + c_, spec.bn_momentum,
                                              spec.bn_eps);
    } else {
      ctx.backend.batch_norm_forward_inference(ctx.in[0], ctx.out, params, running_,
                                               running_ + c_, spec.bn_eps);
    }
  }
  void backward(StepContext& ctx) override {
    auto op = [&](const Tensor& dx, float) {
      ctx.backend.batch_norm_backward(ctx.in[0], ctx.dout, params, saved_, saved_ + c_, dx, grads,
                                      0.0f, spec.bn_eps);
    };
    // gamma and beta need gradients even where the input does not, and
    // batch norm has no weights-only backward: then dx goes to scratch.
    if (ctx.needs_grad(0)) {
      ctx.emit_grad(0, false, op);
    } else {
      op(ctx.scratch_like(ctx.in[0]), 0.0f);
    }
    ctx.gradients_ready();
  }
  void describe_backward(memory::LayerNode& node) const override {
    node.backward_reads_inputs = true;
    node.backward_accumulates = false;
    node.backward_needs_input_grad = true;
  }

 private:
  int64_t c_;
  float* running_ = nullptr;
  float* saved_ = nullptr;
};

class AddLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(StepContext& ctx, bool) override {
    ctx.backend.add(ctx.in[0], ctx.in[1], ctx.out);
    for (size_t i = 2; i < ctx.in.size(); ++i) ctx.backend.add(ctx.out, ctx.in[i], ctx.out);
  }
  void backward(StepContext& ctx) override {
    for (int i = 0; i < static_cast<int>(ctx.in.size()); ++i) {
      ctx.emit_grad(i, true, [&](const Tensor& dx, float beta) {
        ctx.backend.accumulate(ctx.dout, dx, beta);
      });
    }
  }
};

class ConcatLayer final : public Layer {
 public:
  using Layer::Layer;
  void forward(StepContext& ctx, bool) override { ctx.backend.concat_forward(ctx.in, ctx.out); }
  void backward(StepContext& ctx) override {
    int64_t offset = 0;
    for (int i = 0; i < static_cast<int>(ctx.in.size()); ++i) {
      ctx.emit_grad(i, true, [&](const Tensor& dx, float beta) {
        ctx.backend.concat_backward(ctx.dout, offset, dx, beta);
      });
      offset += ctx.in[i].shape().c;
    }
  }
};

}  // namespace

// --------------------------------------------------------------- Network

ConvProblem conv_problem(const LayerSpec& conv, const TensorDesc& x, const TensorDesc& y) {
  ConvProblem p;
  p.x = x;
  p.y = y;
  p.k = conv.out;
  p.r = conv.kernel_h;
  p.s = conv.kernel_w;
  p.pad_h = conv.pad_h;
  p.pad_w = conv.pad_w;
  p.stride_h = conv.stride_h;
  p.stride_w = conv.stride_w;
  return p;
}

std::vector<ConvKind> conv_kernels_of(const Graph& graph, int layer) {
  if (graph.inputs(layer)[0] == graph.input_index()) {
    return {ConvKind::kForward, ConvKind::kBackwardFilter};
  }
  return {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter};
}

std::vector<TensorDesc> activation_descs(const Graph& graph, const Backend& backend, int64_t n) {
  return activation_descs(
      graph, [&](int64_t channels) { return backend.preferred_layout(channels); }, n);
}

std::vector<TensorDesc> activation_descs(const Graph& graph,
                                         const std::function<Layout(int64_t)>& preferred_layout,
                                         int64_t n) {
  std::vector<TensorDesc> descs(graph.size());
  for (int i = 0; i < graph.size(); ++i) {
    Shape shape = graph.output_shape(i);
    shape.n = n;
    Layout layout = Layout::kPlain;
    switch (graph.layer(i).type) {
      case LayerType::kInput:
      case LayerType::kFc: layout = Layout::kPlain; break;
      // Element-wise layers keep their input's layout: no reorder between them.
      case LayerType::kRelu:
      case LayerType::kBatchNorm:
      case LayerType::kPool: layout = descs[graph.inputs(i)[0]].layout; break;
      case LayerType::kConv:
      case LayerType::kAdd:
      case LayerType::kConcat: layout = preferred_layout(shape.c); break;
    }
    descs[i] = {shape, layout};
  }
  return descs;
}

Network::Network(const Graph& graph, Backend& backend, const NetworkOptions& options)
    : graph_(graph), backend_(backend), options_(options) {
  if (options.max_batch < 1) throw std::invalid_argument("Network: max_batch must be >= 1");
  const int count = graph.size();
  out_desc_ = activation_descs(graph, backend, options.max_batch);

  // A plan's executions: one per conv layer, each naming one.
  auto execution_of = [&](const std::string& name) -> const ConvLayerExecution* {
    if (options.conv_executions.empty()) return nullptr;
    for (const ConvLayerExecution& e : options.conv_executions) {
      if (e.layer == name) return &e;
    }
    throw BackendError("layer '" + name + "': the plan has no convolution configuration for it");
  };
  for (const ConvLayerExecution& e : options.conv_executions) {
    const int i = graph.find(e.layer);
    if (i < 0 || graph.layer(i).type != LayerType::kConv) {
      throw BackendError("the plan configures '" + e.layer + "', which is not a conv layer of " +
                         "the model");
    }
    for (const ConvKernelExecution& k : e.kernels) {
      if (k.workspace_offset + k.workspace_bytes > options.conv_workspace_bytes) {
        throw BackendError("layer '" + e.layer + "': workspace segment [" +
                           std::to_string(k.workspace_offset) + ", " +
                           std::to_string(k.workspace_offset + k.workspace_bytes) +
                           ") lies outside the plan's workspace of " +
                           std::to_string(options.conv_workspace_bytes) + " bytes");
      }
    }
  }

  // Operators.
  for (int i = 0; i < count; ++i) {
    const LayerSpec& spec = graph.layer(i);
    const std::vector<int>& in = graph.inputs(i);
    const TensorDesc* x = in.empty() ? nullptr : &out_desc_[in[0]];
    std::unique_ptr<Layer> layer;
    try {
      switch (spec.type) {
        case LayerType::kInput: layer = std::make_unique<InputLayer>(spec); break;
        case LayerType::kConv:
          layer = std::make_unique<ConvLayer>(spec, backend, *x, out_desc_[i],
                                              options.conv_algorithm, execution_of(spec.name),
                                              conv_kernels_of(graph, i));
          break;
        case LayerType::kRelu: layer = std::make_unique<ReluLayer>(spec); break;
        case LayerType::kPool: {
          auto pool = std::make_unique<PoolLayer>(spec, *x, out_desc_[i]);
          pool->measure_state(backend);
          layer = std::move(pool);
          break;
        }
        case LayerType::kFc: layer = std::make_unique<FcLayer>(spec, x->shape); break;
        case LayerType::kBatchNorm:
          layer = std::make_unique<BatchNormLayer>(spec, x->shape.c);
          break;
        case LayerType::kAdd: layer = std::make_unique<AddLayer>(spec); break;
        case LayerType::kConcat: layer = std::make_unique<ConcatLayer>(spec); break;
      }
    } catch (const BackendError& e) {
      throw BackendError("layer '" + spec.name + "': " + e.what());
    }
    layers_.push_back(std::move(layer));
  }

  // Parameter layout (the memory part allocates the buffers below).
  for (int i = 0; i < count; ++i) {
    if (const int64_t c = layers_[i]->param_count()) {
      param_ranges_.push_back({i, param_count_, c});
      param_count_ += c;
    }
    buffer_count_ += layers_[i]->buffer_count();
  }
  // The ops' own scratch is taken now, so the pool is sized around it.
  backend.reserve_scratch(op_scratch_bytes(graph, out_desc_, backend));
  if (options.conv_algorithm == "auto") tune_convolutions();
  plan_memory();
  grad_written_.assign(count, false);
}

namespace {

// The memory part's view of a layer (what its backward reads and writes
// comes from the layer itself).
memory::LayerNode memory_node(const Graph& graph, int i, const TensorDesc& out,
                              const Layer& layer) {
  const LayerSpec& spec = graph.layer(i);
  memory::LayerNode node;
  node.name = spec.name;
  node.is_input = spec.type == LayerType::kInput;
  node.is_conv = spec.type == LayerType::kConv;
  node.inputs = graph.inputs(i);
  node.output_bytes = out.bytes();
  node.state_bytes = layer.state_bytes();
  layer.describe_backward(node);
  return node;
}

}  // namespace

void Network::plan_memory() {
  using memory::TensorKind;
  const int count = graph_.size();
  const bool planned_convs = !options_.conv_executions.empty();
  model_.persistent = {
      {"params", static_cast<size_t>(std::max<int64_t>(param_count_, 1)) * sizeof(float)},
      {"grads", static_cast<size_t>(std::max<int64_t>(param_count_, 1)) * sizeof(float)},
      {"buffers", static_cast<size_t>(std::max<int64_t>(buffer_count_, 1)) * sizeof(float)},
      {"labels", static_cast<size_t>(options_.max_batch) * sizeof(int32_t)}};
  if (planned_convs && options_.conv_workspace_bytes > 0) {
    model_.persistent.push_back({"conv_workspace", options_.conv_workspace_bytes});
  }
  for (int i = 0; i < count; ++i) {
    model_.layers.push_back(memory_node(graph_, i, out_desc_[i], *layers_[i]));
  }

  // What the schedule must fit: the pool's capacity.
  const size_t capacity = room();
  const memory::Policy policy = options_.memory_policy;
  const memory::Planner planner = options_.memory_planner;
  MemoryStats& fixed = fixed_stats_;
  fixed.policy = memory::policy_name(policy);
  memory::Simulation simulation;
  if (policy == memory::Policy::kDyn) {
    // The kernels' candidates with their tuned times (Sec. III-C).
    std::vector<memory::KernelChoices> kernels;
    for (int i = 0; i < count; ++i) {
      auto* conv = dynamic_cast<ConvLayer*>(layers_[i].get());
      if (!conv || conv->planned()) continue;
      for (ConvKind kind : conv->kernels()) {
        memory::KernelChoices k{i, kind, {}};
        for (const auto& [a, seconds] : conv->timed_candidates(kind)) {
          k.options.push_back({a.name, a.workspace_bytes, seconds});
        }
        kernels.push_back(std::move(k));
      }
    }
    memory::DynamicDecision d = memory::choose_dynamic(model_, kernels, capacity, planner);
    for (size_t k = 0; k < kernels.size(); ++k) {
      static_cast<ConvLayer&>(*layers_[kernels[k].layer])
          .choose_algorithm(kernels[k].kind, kernels[k].options[d.choice[k]].name);
    }
    memory::apply_choice(model_, kernels, d.choice);
    schedule_ = memory::layer_wise_schedule(model_, d.offload);
    simulation = std::move(d.simulation);
    fixed.policy = "dyn (" + d.pass + ")";
  } else {
    schedule_ = memory::make_schedule(model_, policy);
    simulation = memory::simulate(model_, schedule_, capacity, planner);
  }
  const std::string where = options_.memory_capacity > 0
                                ? "memory capacity " + memory::format_bytes(capacity)
                                : "capacity " + memory::format_bytes(capacity) +
                                      " (device.memory_limit or the device's memory, less " +
                                      "what is in use)";
  if (!simulation.fits) {
    throw memory::OutOfMemoryError("memory.policy " + fixed.policy + ": " + simulation.failure +
                                   "; " + where);
  }
  fixed.offload = memory::offload_name(schedule_.offload);
  fixed.planner = memory::planner_name(planner);
  fixed.capacity = capacity;
  fixed.persistent_bytes = simulation.persistent_bytes;
  train_text_ = event_text(schedule_.train);
  evaluate_text_ = event_text(schedule_.evaluate);

  memory::DevicePoolOptions pool_options;
  pool_options.planner = planner;
  pool_options.poison_freed = options_.poison_freed;
  pool_options.capacity_note = where;
  pool_ = std::make_unique<memory::DevicePool>(backend_, simulation.reservation, pool_options);
  pinned_ = std::make_unique<memory::PinnedPool>(backend_, simulation.host_bytes);
  fixed.host_reservation = pinned_->reservation();
  device_.assign(memory::kTensorKindCount, std::vector<void*>(std::max<size_t>(count, model_.persistent.size()),
                                                  nullptr));
  host_.assign(count, nullptr);
  for (const memory::TensorId& id : schedule_.persistent) {
    slot(id.kind, id.layer) =
        pool_->allocate(memory::tensor_bytes(model_, id), memory::tensor_name(model_, id));
  }
  auto persistent = [&](int k) { return device_[static_cast<int>(TensorKind::kPersistent)][k]; };
  params_ = static_cast<float*>(persistent(0));
  grads_ = static_cast<float*>(persistent(1));
  buffers_ = static_cast<float*>(persistent(2));
  labels_ = static_cast<int32_t*>(persistent(3));
  int64_t p = 0, b = 0;
  for (int i = 0; i < count; ++i) {
    layers_[i]->bind(params_ + p, grads_ + p, buffers_ + b);
    p += layers_[i]->param_count();
    b += layers_[i]->buffer_count();
    if (void* state = slot(TensorKind::kState, i)) layers_[i]->bind_state(state);
  }
  if (planned_convs) {
    workspace_bytes_ = options_.conv_workspace_bytes;
    workspace_ = workspace_bytes_ > 0 ? persistent(4) : nullptr;
  } else if (!schedule_.layer_wise) {
    workspace_bytes_ = memory::tensor_bytes(model_, {TensorKind::kWorkspace, -1});
    workspace_ = shared_workspace_;
  }
  if (planner == memory::Planner::kStatic) {
    pool_->plan_from_trace(simulation.step_trace, simulation.static_plan);
  }
}

Network::EventText Network::event_text(const std::vector<memory::Event>& events) const {
  using memory::Op;
  EventText text;
  text.owner = memory::event_owners(events);
  for (size_t k = 0; k < events.size(); ++k) {
    const memory::Event* call = text.owner[k] >= 0 ? &events[text.owner[k]] : nullptr;
    const std::string& name = call ? graph_.layer(call->tensor.layer).name : "";
    text.label.push_back(!call                          ? "step"
                         : call->op == Op::kForward   ? name + " forward"
                         : call->op == Op::kBackward  ? name + " backward"
                                                      : "loss");
    const Op op = events[k].op;
    const bool moves_tensor = op == Op::kAlloc || op == Op::kFree || op == Op::kOffload ||
                              op == Op::kPrefetch;
    text.tensor.push_back(moves_tensor ? memory::tensor_name(model_, events[k].tensor) : "");
  }
  return text;
}

void*& Network::slot(memory::TensorKind kind, int layer) {
  if (layer < 0) {
    return kind == memory::TensorKind::kWorkspace ? shared_workspace_ : shared_scratch_;
  }
  return device_[static_cast<int>(kind)][layer];
}

size_t Network::room() const {
  if (options_.memory_capacity > 0) return options_.memory_capacity;
  const size_t device = backend_.device_info().memory_bytes;
  const size_t in_use = backend_.device_bytes_in_use();
  const size_t optimizer = static_cast<size_t>(param_count_) * options_.optimizer_bytes_per_parameter;
  if (device <= in_use + optimizer) {
    // (A capacity of 0 would mean "unbounded" to the simulator.)
    throw memory::OutOfMemoryError(
        "no device memory left for the network: the device serves " +
        memory::format_bytes(device) + " (device.memory_limit or its memory), " +
        memory::format_bytes(in_use) + " are in use and the optimizer's state needs " +
        memory::format_bytes(optimizer));
  }
  return device - in_use - optimizer;
}

void Network::tune_convolutions() {
  // Each conv layer is timed on buffers of its own, allocated for the
  // tuning only (before the pool exists: its size depends on the outcome).
  struct Buffers {
    Backend& backend;
    const std::string& layer;
    std::vector<void*> held;
    ~Buffers() {
      for (void* p : held) backend.free_device(p);
    }
    float* get(size_t bytes) {
      try {
        held.push_back(backend.allocate_device(std::max<size_t>(bytes, sizeof(float))));
      } catch (const BackendError& e) {
        throw BackendError("timing the convolution algorithms of layer '" + layer +
                           "' (conv.algorithm: auto) needs more device memory than there is; "
                           "name an algorithm in conv.algorithm or give the device more: " +
                           e.what());
      }
      return static_cast<float*>(held.back());
    }
  };
  for (int i = 0; i < graph_.size(); ++i) {
    auto* conv = dynamic_cast<ConvLayer*>(layers_[i].get());
    if (!conv) continue;
    Buffers buf{backend_, graph_.layer(i).name, {}};
    const int in = graph_.inputs(i)[0];
    const Tensor x{out_desc_[in], buf.get(out_desc_[in].bytes())};
    const Tensor y{out_desc_[i], buf.get(out_desc_[i].bytes())};
    const Tensor dy{out_desc_[i], buf.get(out_desc_[i].bytes())};
    const Tensor dx = conv->runs(ConvKind::kBackwardData)
                          ? Tensor{out_desc_[in], buf.get(out_desc_[in].bytes())}
                          : Tensor{};
    const int64_t params = std::max<int64_t>(conv->param_count(), 1);
    float* w = buf.get(params * sizeof(float));
    float* dw = buf.get(params * sizeof(float));
    // Only algorithms whose workspace the device has room for are timed
    // (and so can be chosen): under a memory limit the others cannot run.
    conv->keep_candidates_within(room());
    const size_t ws_bytes = conv->candidate_workspace();
    void* ws = ws_bytes > 0 ? buf.get(ws_bytes) : nullptr;
    // Finite contents: timing must not run on NaNs or denormals.
    for (const Tensor& t : {x, y, dy}) backend_.fill(t, 0.01f);
    if (dx.data) backend_.fill(dx, 0.01f);
    backend_.fill(Tensor{{{params, 1, 1, 1}}, w}, 0.01f);
    conv->bind(w, dw, nullptr);
    conv->tune(backend_, x, y, dy, dx, ws, ws_bytes);
    conv->bind(nullptr, nullptr, nullptr);
  }
}

Network::~Network() {
  try {
    backend_.synchronize(StreamKind::kMemory);
  } catch (...) {
    // A failed copy was reported by the step that issued it.
  }
  // The pools return their reservations.
}

void Network::set_trace(memory::ChromeTrace* trace) {
  trace_ = trace;
  pool_->record_timeline(trace != nullptr);  // memory_timeline() goes with the trace
  trace_in_use();
}

void Network::trace_in_use() {
  if (trace_) {
    trace_->counter("device bytes in use", trace_->now_us(),
                    static_cast<double>(pool_->bytes_in_use()));
  }
}

void* Network::allocate_tensor(const memory::TensorId& id, const std::string& name) {
  void* p = pool_->allocate(memory::tensor_bytes(model_, id), name);
  slot(id.kind, id.layer) = p;
  trace_in_use();
  return p;
}

void Network::init_parameters(uint64_t seed) {
  Rng rng(seed);
  for (auto& layer : layers_) layer->init(rng, backend_);
}

Tensor Network::input(int64_t n) const {
  const int data = graph_.input_index();
  return view(out_desc_[data],
              static_cast<float*>(device_[static_cast<int>(memory::TensorKind::kOutput)][data]), n);
}

std::pair<void*, size_t> Network::workspace_for(int i, bool backward) {
  if (!schedule_.layer_wise || !options_.conv_executions.empty()) {
    return {workspace_, workspace_bytes_};  // network-wide, or a plan's buffer
  }
  const memory::LayerNode& node = model_.layers[i];
  return backward ? std::pair{slot(memory::TensorKind::kBackwardWorkspace, i), node.backward_workspace}
                  : std::pair{slot(memory::TensorKind::kWorkspace, i), node.forward_workspace};
}

void Network::forward_layer(int i, int64_t n, bool training) {
  const auto [ws, ws_bytes] = workspace_for(i, false);
  StepContext ctx{backend_, n, {}, view(out_desc_[i], out(i), n), {}, ws, ws_bytes,
                  {}, {}, {}, {}};
  for (int in : graph_.inputs(i)) ctx.in.push_back(view(out_desc_[in], out(in), n));
  layers_[i]->forward(ctx, training);
}

void Network::backward_layer(int i, int64_t n) {
  using memory::TensorKind;
  const std::vector<int>& inputs = graph_.inputs(i);
  const auto [ws, ws_bytes] = workspace_for(i, true);
  float* scratch = static_cast<float*>(slot(TensorKind::kScratch, schedule_.layer_wise ? i : -1));
  StepContext ctx{backend_, n, {}, view(out_desc_[i], out(i), n),
                  view(out_desc_[i], grad(i), n), ws, ws_bytes, {}, {}, {}, {}};
  for (int in : inputs) ctx.in.push_back(view(out_desc_[in], out(in), n));
  auto scratch_for = [&](const TensorDesc& desc) {
    if (!scratch) {
      throw std::logic_error("layer '" + graph_.layer(i).name +
                             "': the memory schedule gave its backward no scratch gradient");
    }
    return Tensor{desc, scratch};
  };
  ctx.needs_grad = [&](int k) { return inputs[k] != graph_.input_index(); };
  ctx.scratch_like = [&](const Tensor& like) { return scratch_for(like.desc); };
  ctx.emit_grad = [&](int k, bool can_accumulate,
                      const std::function<void(const Tensor&, float)>& op) {
    const int producer = inputs[k];
    if (producer == graph_.input_index()) return;  // the data needs no gradient
    const Tensor dx = view(out_desc_[producer], grad(producer), n);
    if (!grad_written_[producer]) {
      op(dx, 0.0f);
    } else if (can_accumulate) {
      op(dx, 1.0f);
    } else {
      const Tensor tmp = scratch_for(dx.desc);
      op(tmp, 0.0f);
      backend_.accumulate(tmp, dx, 1.0f);
    }
    grad_written_[producer] = true;
  };
  ctx.gradients_ready = [&, i] {
    if (!on_gradients_ready) return;
    for (const ParamRange& r : param_ranges_) {
      if (r.layer == i) on_gradients_ready(r);
    }
  };
  layers_[i]->backward(ctx);
}

void Network::trace_memory_ops() {
  if (!trace_) return;
  const double now = trace_->now_us();
  for (const PendingCopy& c : pending_copies_) {
    trace_->span("memory stream", std::string(c.kind) + " " + c.name, c.kind, c.start_us,
                 now - c.start_us);
  }
  pending_copies_.clear();
}

LossStats Network::run(const std::vector<memory::Event>& events, const EventText& text,
                       int64_t n, bool training, float loss_scale) {
  using memory::Op;
  using memory::TensorKind;
  if (n < 1 || n > options_.max_batch) {
    throw std::invalid_argument("Network: batch " + std::to_string(n) + " outside [1, " +
                                std::to_string(options_.max_batch) + "]");
  }
  LossStats stats;
  int current = -2;  // the layer call whose label the pool has
  for (size_t k = 0; k < events.size(); ++k) {
    const memory::Event& e = events[k];
    const std::string& tensor = text.tensor[k];
    if (text.owner[k] != current) {
      current = text.owner[k];
      pool_->set_label(text.label[k]);
    }
    const int t = e.tensor.layer;
    switch (e.op) {
      case Op::kAlloc: {
        void* p = allocate_tensor(e.tensor, tensor);
        if (e.tensor.kind == TensorKind::kState) layers_[t]->bind_state(p);
        break;
      }
      case Op::kFree: {
        void*& p = slot(e.tensor.kind, t);
        pool_->release(p);
        p = nullptr;
        if (trace_) trace_->instant("memory stream", "release " + tensor, "release", trace_->now_us());
        trace_in_use();
        break;
      }
      case Op::kOffload: {
        const Tensor y = view(out_desc_[t], out(t), n);
        host_[t] = pinned_->allocate(y.bytes(), tensor);
        // The copy starts once the compute stream has produced Y.
        backend_.wait_event(StreamKind::kMemory, backend_.record_event(StreamKind::kCompute));
        backend_.copy_async(host_[t], y.data, y.bytes(), StreamKind::kMemory);
        offloaded_bytes_ += y.bytes();
        if (trace_) pending_copies_.push_back({tensor, "offload", trace_->now_us()});
        break;
      }
      case Op::kPrefetch: {
        void* p = allocate_tensor(e.tensor, tensor);
        // The block may have held a tensor the compute stream was still reading.
        backend_.wait_event(StreamKind::kMemory, backend_.record_event(StreamKind::kCompute));
        backend_.copy_async(p, host_[t], view(out_desc_[t], nullptr, n).bytes(),
                            StreamKind::kMemory);
        if (trace_) pending_copies_.push_back({tensor, "prefetch", trace_->now_us()});
        break;
      }
      case Op::kSyncMemory:
        backend_.synchronize(StreamKind::kMemory);
        trace_memory_ops();
        break;
      case Op::kFreeHost:
        pinned_->release(host_[t]);
        host_[t] = nullptr;
        break;
      case Op::kForward:
      case Op::kBackward: {
        const double start = trace_ ? trace_->now_us() : 0;
        if (e.op == Op::kForward) {
          forward_layer(t, n, training);
        } else {
          backward_layer(t, n);
        }
        if (trace_) {
          backend_.synchronize(StreamKind::kCompute);  // the span covers the work, not its issue
          trace_->span("compute", text.label[k], e.op == Op::kForward ? "forward" : "backward",
                       start, trace_->now_us() - start);
        }
        break;
      }
      case Op::kLoss: {
        const Tensor logits = view(out_desc_[t], out(t), n);
        if (training) {
          const Tensor dlogits = view(out_desc_[t], grad(t), n);
          stats = backend_.softmax_cross_entropy(logits, labels_, loss_scale, &dlogits);
          grad_written_[t] = true;
        } else {
          stats = backend_.softmax_cross_entropy(logits, labels_, loss_scale, nullptr);
        }
        break;
      }
    }
  }
  return stats;
}

void Network::abandon_step() {
  try {
    backend_.synchronize(StreamKind::kMemory);
  } catch (...) {
    // The step's own error is the one to report.
  }
  pending_copies_.clear();
  // Everything the schedule allocates per step goes back to the pools.
  std::vector<std::vector<bool>> keep(memory::kTensorKindCount,
                                      std::vector<bool>(device_[0].size(), false));
  for (const memory::TensorId& id : schedule_.persistent) {
    // The shared workspace and scratch (layer -1) are not in device_.
    if (id.layer >= 0) keep[static_cast<int>(id.kind)][id.layer] = true;
  }
  for (int kind = 0; kind < memory::kTensorKindCount; ++kind) {
    for (size_t l = 0; l < device_[kind].size(); ++l) {
      if (device_[kind][l] && !keep[kind][l]) {
        pool_->release(device_[kind][l]);
        device_[kind][l] = nullptr;
      }
    }
  }
  for (void*& h : host_) {
    if (h) pinned_->release(h);
    h = nullptr;
  }
  if (pool_->in_step()) pool_->end_step();
}

LossStats Network::train_step(int64_t n, float loss_scale) {
  std::fill(grad_written_.begin(), grad_written_.end(), false);
  offloaded_bytes_ = 0;
  pool_->begin_step();
  LossStats stats;
  try {
    stats = run(schedule_.train, train_text_, n, /*training=*/true, loss_scale);
  } catch (...) {
    abandon_step();
    throw;
  }
  pool_->end_step();
  return stats;
}

LossStats Network::evaluate(int64_t n) {
  try {
    return run(schedule_.evaluate, evaluate_text_, n, /*training=*/false, 1.0f);
  } catch (...) {
    abandon_step();
    throw;
  }
}

MemoryStats Network::memory_stats() const {
  MemoryStats s = fixed_stats_;
  s.reservation = pool_->reservation();
  s.step_peak = pool_->step_peak_bytes();
  s.step_average = pool_->step_average_bytes();
  s.offloaded_bytes = offloaded_bytes_;
  s.static_plan = pool_->static_plan();
  return s;
}

const std::vector<memory::TimelineSample>& Network::memory_timeline() const {
  return pool_->timeline();
}

const std::vector<memory::DsaBlock>& Network::last_step_trace() const {
  return pool_->last_step_trace();
}

std::vector<float> Network::download_parameters() const {
  return download_floats(backend_, params_, param_count_);
}
void Network::upload_parameters(const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != param_count_) {
    throw std::invalid_argument("upload_parameters: " + std::to_string(values.size()) +
                                " values for " + std::to_string(param_count_) + " parameters");
  }
  upload_floats(backend_, values, params_);
}
std::vector<float> Network::download_buffers() const {
  return download_floats(backend_, buffers_, buffer_count_);
}
void Network::upload_buffers(const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != buffer_count_) {
    throw std::invalid_argument("upload_buffers: " + std::to_string(values.size()) +
                                " values for " + std::to_string(buffer_count_) + " buffers");
  }
  upload_floats(backend_, values, buffers_);
}

std::vector<std::string> Network::algorithm_summary() const {
  std::vector<std::string> lines;
  for (const auto& layer : layers_) {
    const std::string a = layer->algorithms(backend_);
    if (!a.empty()) lines.push_back(layer->spec.name + ": " + a);
  }
  return lines;
}

}  // namespace vtrain::worker
