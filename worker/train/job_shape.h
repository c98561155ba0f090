// Where one rank stands in a training job: its share of every batch and the
// length of the run, checked against the model and the data.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/data/data.h"
#include "worker/engine/graph.h"
#include "worker/train/trainer.h"

namespace vtrain::worker {

// Where this rank stands in the job, checked against the model and the
// data before anything is allocated.
struct JobShape {
  int rank = 0;
  int ranks = 1;
  int64_t batch = 0;           // the global mini-batch B
  std::vector<int64_t> split;  // per-rank batches, summing to B
  int64_t my_batch = 0;        // split[rank]
  int64_t my_offset = 0;       // where this rank's slice of a batch begins
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  bool evaluates = true;       // train.evaluate (TrainSettings::evaluate)
  int64_t eval_chunk = 0;      // test samples per evaluation upload: my_batch, or on a
                               // rank without samples up to 64 (1 without evaluation)
};

// The shape of this rank's part of training `graph` on `train_set` with
// `options` (the batch, epochs, max_steps, evaluate) in `context`'s job (its
// communicator's ranks, its split). Throws std::invalid_argument saying what does not fit: samples
// or classes against the model, a split that does not match the ranks or
// the batch, a training set smaller than one batch.
JobShape job_shape(const Graph& graph, const Dataset& train_set, const TrainerOptions& options,
                   const TrainerContext& context);

// `job` with another split of the same batch (online re-balancing): this
// rank's batch, offset and evaluation chunk follow it. Throws
// std::invalid_argument when it does not match the ranks or the batch.
JobShape with_split(const JobShape& job, const std::vector<int64_t>& split);

}  // namespace vtrain::worker
