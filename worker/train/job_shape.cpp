#include "worker/train/job_shape.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "balancer/batch_split.h"

namespace vtrain::worker {

namespace {

void check_data_fits_model(const Graph& graph, const Dataset& train_set) {
  if (!(train_set.sample == graph.output_shape(graph.input_index()))) {
    throw std::invalid_argument("the model expects samples of " +
                                graph.output_shape(graph.input_index()).str() +
                                " but the data has " + train_set.sample.str());
  }
  if (train_set.classes > graph.classes()) {
    throw std::invalid_argument("the data has " + std::to_string(train_set.classes) +
                                " classes but the model has " + std::to_string(graph.classes()) +
                                " outputs");
  }
}

}  // namespace

JobShape with_split(const JobShape& job, const std::vector<int64_t>& split) {
  JobShape out = job;
  out.split = split;
  if (static_cast<int>(split.size()) != job.ranks) {
    throw std::invalid_argument("the batch split has " + std::to_string(split.size()) +
                                " entries but the job has " + std::to_string(job.ranks) + " ranks");
  }
  int64_t split_sum = 0;
  out.my_offset = 0;
  for (int r = 0; r < job.ranks; ++r) {
    if (split[r] < 0) throw std::invalid_argument("negative batch in the split");
    if (r < job.rank) out.my_offset += split[r];
    split_sum += split[r];
  }
  if (split_sum != job.batch) {
    throw std::invalid_argument("the batch split sums to " + std::to_string(split_sum) +
                                " but the batch is " + std::to_string(job.batch));
  }
  out.my_batch = split[job.rank];
  // Evaluation runs in chunks of the training batch: the network is built
  // for the larger of the two, and the split was chosen on (and a memory
  // limit checked against) the training batch alone. A rank without
  // samples evaluates in chunks of up to 64, and builds for one sample when
  // the job does not evaluate.
  out.eval_chunk = out.my_batch > 0 ? out.my_batch
                   : job.evaluates  ? std::min<int64_t>(job.batch, 64)
                                    : 1;
  return out;
}

JobShape job_shape(const Graph& graph, const Dataset& train_set, const TrainerOptions& options,
                   const TrainerContext& context) {
  check_data_fits_model(graph, train_set);
  JobShape job;
  job.rank = context.comm ? context.comm->rank() : 0;
  job.ranks = context.comm ? context.comm->size() : 1;
  job.batch = options.train.batch;
  job.evaluates = options.train.evaluate;
  job = with_split(job, context.split.empty() ? balancer::even_split(job.batch, job.ranks)
                                              : context.split);
  job.steps_per_epoch = train_set.count / job.batch;
  if (job.steps_per_epoch < 1) {
    throw std::invalid_argument("the training set has " + std::to_string(train_set.count) +
                                " samples, fewer than one batch of " + std::to_string(job.batch));
  }
  job.total_steps = job.steps_per_epoch * options.train.epochs;
  if (options.train.max_steps > 0) {
    job.total_steps = std::min(job.total_steps, options.train.max_steps);
  }
  return job;
}

}  // namespace vtrain::worker
