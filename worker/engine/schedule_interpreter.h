// The schedule interpreter: executes the memory part's schedule events of a
// network's training step or evaluation: allocations and releases from the
// device pool, offloads and prefetches on the memory stream, layer calls
// (with their gradients' bookkeeping) and the loss. It owns the device pool
// and the pinned host pool the schedule was simulated for, and where every
// tensor is now.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memory/chrome_trace.h"
#include "memory/device_pool.h"
#include "memory/pinned_pool.h"
#include "memory/simulator.h"
#include "memory/vdnn_plan.h"
#include "worker/engine/layers/layer.h"

namespace vtrain::worker {

struct ScheduleInterpreterOptions {
  int64_t max_batch = 1;               // the largest batch a step may run
  memory::Planner planner = memory::Planner::kPool;
  bool poison_freed = false;           // tests: released memory is filled with NaN
  std::string capacity_note;           // what the capacity was, for out-of-memory errors
  bool planned_convs = false;          // a plan's conv executions: the layers' workspace
                                       // is persistent "conv_workspace"
  uint64_t plan_workspace_bytes = 0;   // its size
  SumOverRanks sum_over_ranks;         // given to training forward and backward calls
                                       // (NetworkOptions::sum_over_ranks)
};

class ScheduleInterpreter {
 public:
  // Reserves the pools `simulation` sized, allocates the schedule's
  // persistent tensors and binds the layers' persistent state. `layers`,
  // `out_desc` (per layer, at max batch), `model` and `schedule` must
  // outlive the interpreter.
  ScheduleInterpreter(const Graph& graph, Backend& backend,
                      const std::vector<std::unique_ptr<Layer>>& layers,
                      const std::vector<TensorDesc>& out_desc, const memory::MemoryModel& model,
                      const memory::Schedule& schedule, const memory::Simulation& simulation,
                      const ScheduleInterpreterOptions& options);
  // Waits for the memory stream; the pools return their reservations.
  ~ScheduleInterpreter();
  ScheduleInterpreter(const ScheduleInterpreter&) = delete;
  ScheduleInterpreter& operator=(const ScheduleInterpreter&) = delete;

  // The persistent tensor called `name` in the memory model ("params",
  // "grads", "buffers", "labels", "input_staging", "conv_workspace"). Throws
  // std::logic_error listing the known names when there is none.
  void* persistent(const std::string& name) const;
  // Layer i's output now (null when it is not on the device).
  float* output(int i) const;
  // The workspace layers run in when the schedule is not layer-wise (the
  // network-wide one or a plan's buffer); null and 0 otherwise.
  std::pair<void*, size_t> shared_workspace() const { return {workspace_, workspace_bytes_}; }

  // One training step / evaluation at batch n (1..max_batch, else
  // std::invalid_argument). On an error, whatever the step allocated goes
  // back to the pools before it propagates.
  // The training loss is label-smoothed by label_smoothing
  // (Backend::softmax_cross_entropy); evaluation's is plain.
  LossStats train_step(int64_t n, float loss_scale, float label_smoothing = 0.0f);
  // With `logits`, evaluate also downloads the loss's input there (plain
  // f32, n x classes): it is read at the loss, before a layer-wise
  // schedule releases it.
  LossStats evaluate(int64_t n, float* logits = nullptr);

  // What the following training steps' layer calls get as their
  // LayerCall::step (Network::set_step_context).
  void set_step_context(const StepContext& context) { step_context_ = context; }

  // Called during backward once layer i's parameter gradients are final.
  std::function<void(int)> on_layer_gradients_ready;

  const memory::DevicePool& pool() const { return *pool_; }
  size_t host_reservation() const { return pinned_->reservation(); }
  size_t offloaded_bytes() const { return offloaded_bytes_; }  // in the last training step
  // See Network::set_trace and Network::record_call_times.
  void set_trace(memory::ChromeTrace* trace);
  memory::ChromeTrace* trace() const { return trace_; }
  void record_call_times(std::vector<memory::StepCosts>* steps) { call_times_ = steps; }

 private:
  // Per event of a schedule, fixed once it is: the label of the layer call
  // it belongs to ("conv2 forward", for the timeline and trace) and the name
  // of the tensor a memory event moves ("conv2.y").
  struct EventText {
    std::vector<int> owner;
    std::vector<std::string> label, tensor;
  };
  EventText event_text(const std::vector<memory::ScheduleEvent>& events) const;
  LossStats run(const std::vector<memory::ScheduleEvent>& events, const EventText& text,
                int64_t n, bool training, float loss_scale);
  // The memory operations (kAlloc .. kFreeHost) of an event.
  void run_memory_op(const memory::ScheduleEvent& e, const std::string& tensor, int64_t n);
  // kForward / kRecompute / kBackward, as a compute span when tracing.
  void run_layer_call(const memory::ScheduleEvent& e, const std::string& label, int64_t n,
                      bool training);
  LossStats run_loss(int layer, int64_t n, bool training, float loss_scale);
  float* logits_out_ = nullptr;  // evaluate()'s `logits` while it runs
  // Layer i's forward (or recompute) call: its inputs and output as they
  // are on the device now, its forward workspace.
  LayerCall forward_call(int i, int64_t n);
  void backward_layer(int i, int64_t n);
  // Writes input gradient k of layer i's backward through op (see LayerCall).
  void emit_grad(int i, int k, int64_t n, bool can_add,
                 const std::function<void(const Tensor&, float)>& op);
  Tensor scratch_for(int i, const TensorDesc& desc);
  // The workspace a layer's forward or backward runs in: the shared one, or
  // under the layer-wise policies its own.
  std::pair<void*, size_t> workspace_for(int i, bool backward);
  // The device memory of a tensor now (null when it is not on the device).
  void*& slot(memory::TensorKind kind, int layer);
  void* slot(memory::TensorKind kind, int layer) const;
  void* allocate_tensor(const memory::TensorId& id, const std::string& name);
  Tensor view(int layer, float* data, int64_t n) const;
  void trace_in_use();
  void trace_memory_ops();
  // Releases whatever a failed step left allocated.
  void abandon_step();

  const Graph& graph_;
  Backend& backend_;
  const std::vector<std::unique_ptr<Layer>>& layers_;
  const std::vector<TensorDesc>& out_desc_;
  const memory::MemoryModel& model_;
  const memory::Schedule& schedule_;
  ScheduleInterpreterOptions options_;
  EventText train_text_, evaluate_text_;  // of schedule_.train and schedule_.evaluate
  std::unique_ptr<memory::DevicePool> pool_;
  std::unique_ptr<memory::PinnedPool> pinned_;
  std::vector<std::vector<void*>> device_;  // per TensorKind, per layer (or persistent index)
  void* shared_workspace_ = nullptr;        // TensorKind::kWorkspace, layer -1
  void* shared_scratch_ = nullptr;          // TensorKind::kScratch, layer -1
  std::vector<void*> host_;                 // per layer: its offloaded Y in pinned memory
  void* workspace_ = nullptr;               // shared: policy none, or a plan's buffer
  size_t workspace_bytes_ = 0;
  int32_t* labels_ = nullptr;
  std::vector<bool> grad_written_;  // per step: gradient holds a value already
  size_t offloaded_bytes_ = 0;      // this step
  float label_smoothing_ = 0.0f;  // the training step's, for run_loss
  StepContext step_context_;      // set_step_context's
  // Memory-stream copies issued since the last sync (for the trace).
  struct PendingCopy {
    std::string name;
    const char* kind;
    double start_us;
  };
  std::vector<PendingCopy> pending_copies_;
  memory::ChromeTrace* trace_ = nullptr;
  std::vector<memory::StepCosts>* call_times_ = nullptr;  // a training step appends its calls'
  double calls_seconds_ = 0;                              // times; their sum in this step
};

}  // namespace vtrain::worker
