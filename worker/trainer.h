// The training loop: epochs of seeded shuffles, SGD steps, evaluation,
// progress and metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/backend.h"
#include "worker/data.h"
#include "worker/graph.h"
#include "worker/metrics.h"
#include "worker/optimizer.h"

namespace vtrain::worker {

struct TrainerOptions {
  int64_t batch = 64;            // global mini-batch B
  int64_t epochs = 1;
  int64_t max_steps = 0;         // stop after this many steps in total; 0 = no limit
  uint64_t seed = 1;             // initialisation and shuffling
  int64_t log_every = 50;        // steps between log lines and step metrics
  bool evaluate = true;          // test accuracy after every epoch
  LrSchedule schedule;           // steps_per_epoch and total_steps are filled in by the trainer
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  std::string conv_algorithm = "auto";
  std::string metrics_path;      // JSON lines; empty = none
  Progress::Mode progress = Progress::Mode::kLines;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;              // mean loss of the last step
  double test_accuracy = -1;          // last evaluation, -1 if none ran
  double test_loss = -1;
  double images_per_second = 0;       // training steps only (evaluation excluded)
  size_t peak_device_bytes = 0;
  std::vector<double> step_losses;    // mean loss of every step
};

// Trains `graph` on `backend`. `test` may have count 0 (then no evaluation).
// Throws on any failure; the metrics file then has no "end" record.
TrainResult train(const Graph& graph, Backend& backend, const Dataset& train_set,
                  const Dataset& test_set, const ChannelStats& norm, const TrainerOptions& options);

}  // namespace vtrain::worker
