// `vtrain data pack | bench`: a dataset into tar shards, or the input
// pipeline's images per second alone.
#pragma once

#include "launcher/cli.h"
#include "worker/data/data.h"

namespace vtrain::launcher {

// pack: `data` (the config's training or test set) into shards at cli.out.
// bench: cli.batches batches of `batch` samples of `data` through its
// transform on `workers` decoding threads. Prints what it did; returns the
// exit code. Throws DataError for a file that cannot be read or written.
int run_data(const CliArgs& cli, const worker::Dataset& data, int64_t batch, int workers);

}  // namespace vtrain::launcher
