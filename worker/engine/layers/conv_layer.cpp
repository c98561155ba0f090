#include "worker/engine/layers/conv_layer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "common/text.h"
#include "worker/engine/device_blocks.h"

namespace vtrain::worker {
namespace {

constexpr ConvKind kAllKinds[] = {ConvKind::kForward, ConvKind::kBackwardData,
                                  ConvKind::kBackwardFilter};

}  // namespace

ConvLayer::ConvLayer(const LayerSite& site)
    : Layer(site.spec()),
      problem_(conv_problem(site.spec(), *site.x, site.y)),
      kernels_(conv_kernels_of(site.graph, site.index)) {
  if (site.conv_execution) {
    plan_.emplace(site.backend, spec().name, problem_, kernels_, *site.conv_execution);
  } else {
    choice_.emplace(site.backend, problem_, site.conv_algorithm, spec().name);
  }
}

std::unique_ptr<Layer> make_conv_layer(const LayerSite& site) {
  return std::make_unique<ConvLayer>(site);
}

int64_t ConvLayer::param_count() const {
  return bias_offset() + (spec().bias ? spec().out : 0);
}

void ConvLayer::init(Rng& rng, Backend& backend) {
  const Shape w = problem_.weight_shape();
  const float bound = 1.0f / std::sqrt(static_cast<float>(w.per_sample()));
  std::vector<float> host(static_cast<size_t>(param_count()));
  for (float& v : host) v = rng.uniform(bound);
  upload_floats(backend, host, params());
}

bool ConvLayer::runs(ConvKind kind) const {
  return std::find(kernels_.begin(), kernels_.end(), kind) != kernels_.end();
}

ConvAlgorithmChoice& ConvLayer::choice() {
  if (!choice_) {
    throw std::logic_error("layer '" + spec().name + "': a plan fixes its convolutions");
  }
  return *choice_;
}

size_t ConvLayer::kernel_workspace(ConvKind kind) const {
  return plan_ ? 0 : choice_->chosen(kind).workspace_bytes;
}

float* ConvLayer::bias(float* base) const { return spec().bias ? base + bias_offset() : nullptr; }

const void* ConvLayer::compute_bias() const {
  return spec().bias ? compute_params(bias_offset()) : nullptr;
}

void ConvLayer::describe_backward(memory::LayerNode& node) const {
  node.backward_reads_inputs = true;
  node.backward_accumulates = !planned();  // see backward()
  node.forward_workspace = kernel_workspace(ConvKind::kForward);
  for (ConvKind kind : kernels()) {
    if (kind != ConvKind::kForward) {
      node.backward_workspace = std::max(node.backward_workspace, kernel_workspace(kind));
    }
  }
}

void ConvLayer::forward(LayerCall& call, bool) {
  ConvOperands o;
  o.x = call.in[0];
  o.y = call.out;
  o.w = compute_params();
  o.bias = bias_to_relu_ ? nullptr : compute_bias();
  run(call, ConvKind::kForward, o, 0.0f);
}

void ConvLayer::backward(LayerCall& call) {
  ConvOperands o;
  o.x = call.in[0];
  o.dy = call.dout;
  o.w = compute_params();
  o.dw = grads();
  o.dbias = bias_to_relu_ ? nullptr : bias(grads());
  run(call, ConvKind::kBackwardFilter, o, 0.0f);
  call.gradients_ready();
  // Planned kernels were measured writing dx (beta 0): a second consumer's
  // share is added from a scratch tensor instead.
  call.emit_grad(0, !planned(), [&](const Tensor& dx, float beta) {
    o.dx = dx;
    run(call, ConvKind::kBackwardData, o, beta);
  });
}

void ConvLayer::run(LayerCall& call, ConvKind kind, const ConvOperands& o, float beta) {
  const ConvProblem p = problem_.with_batch(call.n);
  if (!plan_) {
    const ConvStep whole{choice_->chosen(kind).algo, call.n};
    run_conv_kernel(call.backend, kind, p, {&whole, 1}, o, beta, call.workspace,
                    call.workspace_bytes);
    return;
  }
  const auto [offset, bytes] = plan_->segment(kind);
  run_conv_kernel(call.backend, kind, p, plan_->steps(kind), o, beta,
                  static_cast<char*>(call.workspace) + offset, bytes);
}

std::string ConvLayer::algorithms(Backend& backend) const {
  std::string out;
  for (ConvKind kind : kAllKinds) {
    if (!out.empty()) out += " ";
    out += std::string(conv_kind_name(kind)) + "=";
    out += plan_ ? plan_->describe(backend, kind)
                 : backend.conv_algorithm_name(kind, choice_->chosen(kind).algo);
  }
  if (!plan_ && !choice_->refused().empty()) {
    out += "; refused to run, left out: " + common::join(choice_->refused(), "; ");
  }
  return out;
}

void ConvLayer::tune(Backend& backend, const TensorDesc& x_desc, const TensorDesc& y_desc,
                     const std::function<size_t()>& room) {
  ConvAlgorithmChoice& c = choice();
  // Tuning runs before the pool exists (its size depends on the outcome).
  // Its tensors are those its backward needs at once: if they do not fit,
  // no step does.
  DeviceBlocks buf(backend, "timing the convolution algorithms of layer '" + spec().name +
                                "' (conv.algorithm: auto) needs more device memory than there "
                                "is for its input, output gradient and input gradient at once");
  const Tensor x{x_desc, buf.get(x_desc.bytes())};
  // Forward's output and backward's output gradient share a buffer (the
  // timings do not depend on the values), so tuning needs no more than a
  // step's backward does.
  const Tensor y{y_desc, buf.get(y_desc.bytes())};
  const Tensor dy = y;
  const Tensor dx = runs(ConvKind::kBackwardData) ? Tensor{x_desc, buf.get(x_desc.bytes())}
                                                  : Tensor{};
  // Weights in the activations' type (the compute copy), gradients in f32.
  const int64_t count = std::max<int64_t>(param_count(), 1);
  const TensorDesc w_desc = vector_desc(count, x_desc.dtype);
  void* w = buf.get(w_desc.bytes());
  float* dw = buf.get(count * sizeof(float));
  // Only algorithms whose workspace the device has room for are timed
  // (and so can be chosen): under a memory limit the others cannot run.
  c.keep_within(room());
  const size_t ws_bytes = c.candidate_workspace();
  void* ws = ws_bytes > 0 ? buf.get(ws_bytes) : nullptr;
  // Finite contents: timing must not run on NaNs or denormals.
  for (const Tensor& t : {x, y, dy}) backend.fill(t, 0.01f);
  if (dx.data) backend.fill(dx, 0.01f);
  backend.fill(Tensor{w_desc, w}, 0.01f);
  const void* w_bias = spec().bias ? element_at(w, bias_offset(), x_desc.dtype) : nullptr;
  ConvOperands o{x, y, dy, dx, w, w_bias, dw, bias(dw)};
  for (ConvKind kind : kernels()) {
    c.tune(backend, kind, [&](ConvAlgo algo) {
      run_conv_call(backend, kind, problem_, algo, o, 0, 0.0f, ws, ws_bytes);
    });
  }
}

}  // namespace vtrain::worker
