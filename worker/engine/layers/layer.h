// The layer contract: what the network asks of the operator of one graph
// node. A layer owns no device memory: the network binds its parameters,
// gradients and buffers (ranges of its flat buffers) and its state (from the
// memory part's pool), and hands each forward and backward call its tensors
// and workspace in a LayerCall.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memory/vdnn_plan.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"
#include "worker/engine/rng.h"

namespace vtrain::worker {

class ConvLayer;
class ReluLayer;

// Sums `values` over the ranks that train together, in place; synchronous
// and collective (every rank makes the same calls in the same order).
using SumOverRanks = std::function<void(std::vector<double>&)>;

// Which step and which samples a training call computes: what a layer
// whose numbers depend on the sample draws from (dropout's mask,
// worker/device/dropout_draw.h), so that a sample gets the same numbers on
// any rank, after a resume and in a recomputation.
struct StepContext {
  uint64_t seed = 0;         // the run's seed (train.seed)
  int64_t step = 0;          // the optimizer step: the steps done before this one
  int64_t first_sample = 0;  // the index in the step's global batch of the call's sample 0
                             // (this rank's offset in the split)
};

// What a layer sees during one forward or backward call, at batch n.
struct LayerCall {
  Backend& backend;
  int64_t n;
  std::vector<Tensor> in;  // input activations, in the spec's order
  Tensor out;              // output activation
  Tensor dout;             // gradient of the output (backward only)
  void* workspace;         // scratchpad for this call only
  size_t workspace_bytes;
  // Writes the gradient of input i through `op(dst, beta)`. With
  // can_add = true, op is given beta 1 when the gradient already holds
  // another consumer's share; otherwise op writes (beta 0) a scratch tensor
  // that is then added. Does nothing for the data, which needs no gradient.
  std::function<void(int, bool can_add, const std::function<void(const Tensor&, float)>&)>
      emit_grad;
  std::function<bool(int)> needs_grad;                // input i is not the data
  std::function<Tensor(const Tensor&)> scratch_like;  // scratch with like's descriptor
  std::function<void()> gradients_ready;  // the layer's parameter gradients are final
  // Training forward and backward of a step whose batch is split over ranks
  // that normalise together (model.batch_norm: sync): how batch norm adds
  // up its statistics. Null: this rank's samples alone (one rank, local,
  // evaluation, recomputation, timing runs).
  SumOverRanks sum_over_ranks;
  // The step and samples of a training call (Network::set_step_context);
  // the defaults in timing runs.
  StepContext step;
};

// A layer's persistent storage, named: its ranges of the network's flat
// parameter, gradient and buffer arrays (null where it has none).
struct LayerStorage {
  float* params = nullptr;   // param_count() floats, learned (the fp32 master copy)
  float* grads = nullptr;    // param_count() floats, their gradients
  float* buffers = nullptr;  // buffer_count() floats, saved but not learned
  // The parameters in the activations' type, which conv and fc kernels
  // read: under a half precision a copy the network refreshes from params
  // before forward runs (compute_type elements); null: params itself.
  const void* compute_params = nullptr;
  DataType compute_type = DataType::kF32;
};

class Layer {
 public:
  explicit Layer(const LayerSpec& spec) : spec_(spec) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const LayerSpec& spec() const { return spec_; }

  // Floats of parameters (and as many gradients) and of non-learned buffers
  // the layer keeps; fixed at construction.
  virtual int64_t param_count() const { return 0; }
  virtual int64_t buffer_count() const { return 0; }
  // Whether its kernels read the parameters through compute_params() (conv
  // and fc): under a half precision the network keeps those a half copy.
  // The others (batch norm) read params() in f32 and get none.
  virtual bool reads_compute_params() const { return false; }
  // Where those live from now on (the network binds once; tuning binds
  // temporary buffers and unbinds). Never owned by the layer.
  void bind(const LayerStorage& storage) { storage_ = storage; }
  // Writes initial parameters (and buffers) into the bound storage,
  // drawing from `rng` in a fixed order so a seed fixes the model.
  virtual void init(Rng& rng, Backend& backend) {}

  // Device bytes kept from forward to backward (pooling indices, batch
  // statistics), and where they are now: the memory part allocates them,
  // possibly per step, and binds them before forward runs.
  virtual size_t state_bytes() const { return 0; }
  virtual void bind_state(void* state) {}

  // Computes call.out from call.in; `training` selects batch statistics
  // (batch norm) over running ones.
  virtual void forward(LayerCall& call, bool training) = 0;
  // The forward again during backward (memory::Op::kRecompute), its output
  // having been released: training mode and the same numbers as the
  // step's forward (the state it rewrites, such as pooling indices, comes
  // out identical), but nothing that must change once per step, such as
  // batch norm's running statistics, changes again.
  virtual void recompute(LayerCall& call) { forward(call, true); }
  // Writes every input's gradient through call.emit_grad and the parameter
  // gradients into the bound grads (overwriting), then calls
  // call.gradients_ready once those are final.
  virtual void backward(LayerCall& call) = 0;
  // A step in which this rank has no samples while the others train with
  // sum_over_ranks: makes the collectives forward (then backward, with
  // `backward` set) would make, contributing nothing, and updates what
  // every rank updates alike (batch norm's running statistics).
  virtual void train_without_samples(const SumOverRanks& sum_over_ranks, bool backward) {}
  // The memory part's view of backward(): what it reads and how it writes
  // input gradients (see memory::LayerNode). Beside each backward() so that
  // the two change together; the use-after-release tests (poisoned pool)
  // check that they agree. Default: reads nothing, may add into gradients.
  virtual void describe_backward(memory::LayerNode& node) const {}
  // The algorithms the layer runs, for the summary ("" when it has none).
  virtual std::string algorithms(Backend& backend) const { return ""; }

  // This layer as a convolution or a relu, or null for every other type:
  // the network reaches their own interfaces (a convolution's algorithm
  // choice and tuning, pairing its bias with the relu after it) this way.
  virtual ConvLayer* as_conv() { return nullptr; }
  virtual const ConvLayer* as_conv() const { return nullptr; }
  virtual ReluLayer* as_relu() { return nullptr; }

 protected:
  float* params() const { return storage_.params; }
  // Element `offset` of the parameters as conv and fc kernels read them
  // (LayerStorage::compute_params, else params).
  const void* compute_params(int64_t offset = 0) const {
    if (!storage_.compute_params) return storage_.params + offset;
    return element_at(storage_.compute_params, offset, storage_.compute_type);
  }
  float* grads() const { return storage_.grads; }
  float* buffers() const { return storage_.buffers; }

 private:
  LayerSpec spec_;
  LayerStorage storage_;
};

// Host <-> device copies of flat float arrays (parameters, buffers).
void upload_floats(Backend& backend, const std::vector<float>& host, float* device);
std::vector<float> download_floats(Backend& backend, const float* device, int64_t count);

}  // namespace vtrain::worker
