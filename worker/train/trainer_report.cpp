#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "worker/train/evaluate.h"
#include "worker/data/gather.h"
#include "worker/train/trainer_internal.h"

namespace vtrain::worker::trainer_internal {

// Where the ranks compute in different precisions: each one's, the type
// the gradients travel in and where the loss is scaled.
void Trainer::print_precisions() {
  if (std::all_of(precisions_.begin(), precisions_.end(),
                  [&](common::Precision p) { return p == precisions_.front(); })) {
    return;
  }
  std::vector<std::string> each, scaled;
  for (size_t r = 0; r < precisions_.size(); ++r) {
    each.push_back(common::precision_name(precisions_[r]));
    if (plan_loss_scaling(options_.train.loss_scaling, precisions_, static_cast<int>(r)).here) {
      scaled.push_back(std::to_string(r));
    }
  }
  progress_.line(format("precision per rank: %s; gradients exchanged in %s; loss scaled on %s",
                        common::join(each, ", ").c_str(), common::dtype_name(allreduce_.wire()),
                        scaled.empty() ? "no rank"
                                       : ("rank " + common::join(scaled, ", ") +
                                          (scaling_.divide_after_exchange
                                               ? ""
                                               : " (unscaled before the exchange)"))
                                             .c_str()));
}

void Trainer::print_setup() {
  const std::string split_text = balancer::join_batches(job_.split);
  progress_.line(format("model: %d layers, %lld parameters, %s; batch %lld (per rank: %s), %lld "
                        "steps/epoch; device memory %s in use (workspace %s)",
                        graph_.size(), static_cast<long long>(net_->parameter_count()),
                        common::precision_name(options_.settings.precision),
                        static_cast<long long>(job_.batch), split_text.c_str(),
                        static_cast<long long>(job_.steps_per_epoch),
                        common::format_mib(backend_.device_bytes_in_use()).c_str(),
                        common::format_mib(net_->workspace_bytes()).c_str()));
  for (const std::string& line : net_->algorithm_summary()) progress_.line("  " + line);
  print_precisions();
  if (parallel() && context_.batch_norm_comm != nullptr && net_->buffer_count() > 0) {
    progress_.line(format("batch norm: synchronised, statistics of the global batch of %lld "
                          "over %d ranks",
                          static_cast<long long>(job_.batch), job_.ranks));
  }
  const MemoryStats m = net_->memory_stats();
  progress_.line(format("memory: policy %s, planner %s; pool %s reserved of %s (%s persistent), "
                        "pinned host %s",
                        m.policy.c_str(), m.planner.c_str(), common::format_mib(m.reservation).c_str(),
                        common::format_mib(m.capacity).c_str(), common::format_mib(m.persistent_bytes).c_str(),
                        common::format_mib(m.host_reservation).c_str()));
  if (transforms_samples(train_set_)) {
    progress_.line(format("data: %lld training samples, transform %s; test transform %s; %s, %d batch(es) "
                          "ahead (data.workers, data.prefetch_batches)",
                          static_cast<long long>(train_set_.count), train_set_.transform.str().c_str(),
                          test_set_.transform.str().c_str(),
                          pool_ ? format("%d decoding thread(s)", pool_->workers()).c_str()
                                : "decoded on the gathering thread",
                          staging_.gather_ahead ? options_.prefetch_batches : 0));
  }
  if (staging_.gather_ahead) {
    progress_.line(staging_.prefetch_input
                       ? "data: each next batch gathered on a thread and copied to the device "
                         "while the step before runs (data.prefetch)"
                       : "data: each next batch gathered on a thread while the step before runs "
                         "(data.prefetch)");
  }
}

void Trainer::log_step(int64_t epoch, int64_t i, const StepTotals& totals) {
  const double loss = totals.loss_sum / static_cast<double>(job_.batch);
  const double accuracy = totals.correct / static_cast<double>(job_.batch);
  result_.step_losses.push_back(loss);
  const double ips =
      train_seconds_ > 0 ? static_cast<double>(timed_images_) / train_seconds_ : 0;
  const int64_t step = at_.step;
  const bool log_point = step % options_.train.log_every == 0 || step == job_.total_steps;
  // Where batches are decoded the line also says how long this rank's step waited for its input.
  const std::string wait =
      transforms_samples(train_set_) ? format(" input wait %.1f ms", 1e3 * input_wait_) : std::string();
  progress_.step(format("epoch %lld/%lld step %lld/%lld loss %.4f acc %.3f lr %.4g %.0f img/s%s",
                        static_cast<long long>(epoch + 1),
                        static_cast<long long>(options_.train.epochs),
                        static_cast<long long>(i + 1),
                        static_cast<long long>(job_.steps_per_epoch), loss, accuracy, totals.lr,
                        ips, wait.c_str()),
                 log_point);
  if (!log_point) return;
  const MemoryStats memory = net_->memory_stats();
  JsonRecord record;
  record.add("event", "step")
      .add("step", step)
      .add("epoch", epoch + 1)
      .add("loss", loss)
      .add("accuracy", accuracy)
      .add("lr", totals.lr)
      .add("images_per_second", ips)
      .add("step_ms", 1e3 * totals.seconds)
      .add("input_wait_ms", 1e3 * input_wait_)
      .add("device_bytes", static_cast<int64_t>(backend_.device_bytes_in_use()))
      .add("memory_step_peak_bytes", static_cast<int64_t>(memory.step_peak))
      .add("memory_step_average_bytes", memory.step_average)
      .add("compute_ms", rebalancer_.compute_ms())
      .add("input_wait_ms_per_rank", rebalancer_.input_wait_ms())
      .add("split", std::span<const int64_t>(job_.split));
  // The norm clip_norm measured (before clipping).
  if (options_.optimizer.clip_norm > 0) {
    record.add("gradient_norm", optimizer_.last_gradient_norm());
  }
  metrics_.write(record);
}

// The epoch's summary line and record, with a test-set evaluation if asked.
void Trainer::end_epoch(int64_t epoch, const EpochTotals& totals, Clock::time_point start) {
  const double seen = static_cast<double>(std::max<int64_t>(totals.seen, 1));
  JsonRecord record;
  record.add("event", "epoch")
      .add("epoch", epoch + 1)
      .add("step", at_.step)
      .add("train_loss", totals.loss_sum / seen)
      .add("train_accuracy", totals.correct / seen)
      .add("seconds", seconds_since(start));
  std::string summary = format("epoch %lld/%lld: train loss %.4f acc %.4f",
                               static_cast<long long>(epoch + 1),
                               static_cast<long long>(options_.train.epochs),
                               totals.loss_sum / seen, totals.correct / seen);
  if (options_.train.evaluate && test_set_.count > 0) {
    share_batch_norm_statistics();
    const EvaluationCounts e = evaluate(*net_, test_set_, norm_, eval_stage_,
                                        {.chunk = job_.eval_chunk, .comm = comm_, .pool = pool_.get()});
    result_.test_accuracy = e.accuracy();
    result_.test_top5_accuracy = e.top5_accuracy();
    result_.test_loss = e.loss();
    record.add("test_loss", e.loss())
        .add("test_accuracy", e.accuracy())
        .add("test_top5_accuracy", e.top5_accuracy());
    summary += format(", test loss %.4f acc %.4f top-5 %.4f", e.loss(), e.accuracy(),
                      e.top5_accuracy());
    if (ema_) {
      // The average in the weights' place for its evaluation, then the weights back.
      const std::vector<float> weights = net_->download_parameters();
      net_->upload_parameters(ema_->download());
      const EvaluationCounts a = evaluate(*net_, test_set_, norm_, eval_stage_,
                                          {.chunk = job_.eval_chunk, .comm = comm_, .pool = pool_.get()});
      net_->upload_parameters(weights);
      result_.ema_test_accuracy = a.accuracy();
      result_.ema_test_loss = a.loss();
      record.add("ema_test_loss", a.loss()).add("ema_test_accuracy", a.accuracy());
      summary += format(", ema test loss %.4f acc %.4f", a.loss(), a.accuracy());
    }
  }
  summary += format(" (%.1f s)", seconds_since(start));
  progress_.line(summary);
  metrics_.write(record);
}

// The result's totals, and the trace: one file, one process per rank,
// gathered and written by rank 0.
void Trainer::finish() {
  result_.steps = at_.step;
  result_.final_loss = result_.step_losses.empty() ? 0 : result_.step_losses.back();
  result_.images_per_second =
      train_seconds_ > 0 ? static_cast<double>(timed_images_) / train_seconds_ : 0;
  result_.peak_device_bytes = backend_.device_bytes_peak();
  result_.memory = net_->memory_stats();
  result_.final_split = job_.split;
  result_.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  result_.skipped_steps = scaler_ ? scaler_->skipped_steps() : 0;
  result_.input_bound = train_seconds_ > 0 && result_.input_wait_seconds > kInputBoundRunShare * train_seconds_;
  if (pool_) result_.input_rate = pool_->measured_rate();
  if (trace_) {
    net_->set_trace(nullptr);
    std::vector<std::string> parts = parallel()
                                         ? comm_->gather(trace_->events_json(), 0)
                                         : std::vector<std::string>{trace_->events_json()};
    if (leader()) {
      memory::write_trace_file(context_.trace_path, memory::merge_chrome_traces(parts));
      progress_.line("trace: " + context_.trace_path);
    }
  }
  if (comm_) {
    result_.allreduce_seconds = comm_->allreduce_seconds();
    result_.allreduce_exposed_seconds = comm_->wait_seconds();
  }
}

void Trainer::write_end_record() {
  const TrainResult& r = result_;
  JsonRecord end;
  end.add("event", "end")
      .add("steps", r.steps)
      .add("final_loss", r.final_loss)
      .add("images_per_second", r.images_per_second)
      .add("peak_device_bytes", static_cast<int64_t>(r.peak_device_bytes))
      .add("precision", common::precision_name(options_.settings.precision))
      .add("memory_policy", r.memory.policy)
      .add("memory_step_peak_bytes", static_cast<int64_t>(r.memory.step_peak))
      .add("memory_step_average_bytes", r.memory.step_average)
      .add("ranks", static_cast<int64_t>(job_.ranks))
      .add("allreduce_seconds", r.allreduce_seconds)
      .add("allreduce_exposed_seconds", r.allreduce_exposed_seconds)
      .add("allreduce_type", common::dtype_name(allreduce_.wire()))
      .add("rebalances", r.rebalances)
      .add("skipped_steps", r.skipped_steps)
      .add("prefetched_batches", r.prefetched_batches)
      .add("loss_scale", r.loss_scale);
  if (r.test_accuracy >= 0) {
    end.add("test_accuracy", r.test_accuracy)
        .add("test_top5_accuracy", r.test_top5_accuracy)
        .add("test_loss", r.test_loss);
  }
  if (r.ema_test_accuracy >= 0) {
    end.add("ema_test_accuracy", r.ema_test_accuracy).add("ema_test_loss", r.ema_test_loss);
  }
  if (r.target_epoch > 0) end.add("target_epoch", r.target_epoch);
  if (transforms_samples(train_set_)) {
    end.add("input_wait_seconds", r.input_wait_seconds).add("input_bound", static_cast<int64_t>(r.input_bound));
    if (r.input_rate.images > 0) end.add("input_images_per_second", r.input_rate.images_per_second);
  }
  metrics_.write(end);
}

void Trainer::print_summary() {
  const TrainResult& r = result_;
  std::string comm_text;
  if (job_.ranks > 1 && r.allreduce_seconds > 0) {
    comm_text = format(", allreduce %.2f s of which %.0f%% hidden behind backward",
                       r.allreduce_seconds,
                       100.0 * std::max(0.0, 1.0 - r.allreduce_exposed_seconds /
                                                       r.allreduce_seconds));
  }
  progress_.line(format("memory: last step peak %s, average %s, offloaded %s; pool reserved %s",
                        common::format_mib(r.memory.step_peak).c_str(),
                        common::format_mib(static_cast<size_t>(r.memory.step_average)).c_str(),
                        common::format_mib(r.memory.offloaded_bytes).c_str(), common::format_mib(r.memory.reservation).c_str()));
  if (const memory::StaticPlanReport& sp = r.memory.static_plan; sp.active && sp.blocks > 0) {
    progress_.line(format(
        "memory: static plan of %d blocks spans %s above the persistent tensors: "
        "%.3fx the lower bound %s%s; %d plan(s), %d re-plan(s), %.2f ms to solve",
        sp.blocks, common::format_mib(sp.plan_peak).c_str(),
        sp.lower_bound > 0 ? static_cast<double>(sp.plan_peak) / sp.lower_bound : 1.0,
        common::format_mib(sp.lower_bound).c_str(),
        sp.pool_span > 0 ? (" (best fit as requests came: " + common::format_mib(sp.pool_span) + ")").c_str()
                         : "",
        sp.plans, sp.replans, 1000.0 * sp.plan_seconds));
  }
  std::string accuracy;
  if (r.test_accuracy >= 0) {
    accuracy = format(", test accuracy %.4f (top-5 %.4f)", r.test_accuracy, r.test_top5_accuracy);
  }
  if (r.ema_test_accuracy >= 0) accuracy += format(" (ema %.4f)", r.ema_test_accuracy);
  if (transforms_samples(train_set_) && train_seconds_ > 0) {
    const double share = r.input_wait_seconds / train_seconds_;
    progress_.line(format("data: steps waited %.2f s for input of %.2f s (%.0f%%): %s%s",
                          r.input_wait_seconds, train_seconds_, 100.0 * share,
                          r.input_bound ? "input-bound (more data.workers, or shards packed with "
                                          "--max-side, would speed it up)"
                                        : "not input-bound",
                          r.input_rate.images > 0
                              ? format("; decoding pool %d thread(s), %.0f img/s", r.input_rate.workers,
                                       r.input_rate.images_per_second)
                                    .c_str()
                              : ""));
  }
  progress_.line(format("done: %lld steps, %.0f img/s, peak device memory %s%s%s",
                        static_cast<long long>(r.steps), r.images_per_second,
                        common::format_mib(r.peak_device_bytes).c_str(), accuracy.c_str(),
                        comm_text.c_str()));
}

}  // namespace vtrain::worker::trainer_internal
