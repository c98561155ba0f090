// `vtrain evaluate` and `vtrain predict`: the model of a checkpoint scored
// on the config's test set (worker/train/evaluate.h), or its most likely
// classes for chosen inputs (docs/evaluate.md).
#pragma once

#include "configs/config.h"
#include "launcher/cli.h"
#include "worker/comm/communicator.h"
#include "worker/data/data.h"
#include "worker/engine/graph.h"

namespace vtrain::launcher {

// What both commands start from, made as training makes it (main.cpp): the
// config, its data, the model built and checked against it, and the
// normalisation training used.
struct TrainedModelSetup {
  config::Config cfg;
  worker::Dataset train;
  worker::Dataset test;
  worker::Graph graph;
  worker::ChannelStats norm;
};

// Collective over `comm`: rank 0 reads the checkpoint and prints (or writes
// --confusion), every rank scores its share of the test set. Throws
// CheckpointError (no checkpoint at --checkpoint, another model's),
// common::OutputError (--confusion). Returns the exit code.
int run_evaluate(const CliArgs& cli, const TrainedModelSetup& setup, worker::Communicator& comm);

// One process. Throws UsageError for an INPUT that is not one of the forms
// predict reads or names no sample, and what run_evaluate throws for the
// checkpoint. Returns the exit code.
int run_predict(const CliArgs& cli, const TrainedModelSetup& setup);

}  // namespace vtrain::launcher
