// Checks of a loaded config against what can actually run: the machine
// (threads, memory) and, once the data's sample shape is known, the model.
// `vtrain check` and `vtrain train` (also profile and balance) run the same
// checks, so check refuses what training would. Errors are ConfigErrors
// naming FILE:LINE and the key (config.h: fail_at).
#pragma once

#include <cstdint>

#include "configs/config.h"
#include "configs/model_graph.h"
#include "worker/device/backend.h"
#include "worker/engine/graph.h"

namespace vtrain::config {

// What the machine that runs the config offers.
struct Machine {
  int hardware_threads = 1;    // common::hardware_threads()
  uint64_t memory_bytes = 0;   // common::usable_memory_bytes(); 0 = unknown (no memory checks)
  bool device_is_host = true;  // the CPU backend: device memory is this memory
};

// device.threads may oversubscribe the hardware threads up to this factor;
// far beyond it a step spends its time switching threads (10000 threads on
// 2 cores take minutes per step) or the thread pool cannot start at all.
constexpr int kMaxThreadsPerHardwareThread = 4;

// Before the data is loaded: device.threads against the hardware threads,
// device.memory_limit against the memory (CPU device), and the bytes a
// synthetic dataset takes (samples and class prototypes) against the memory.
void check_machine(const Config& config, const Machine& machine);

// The last layer must give one score per class, at least `classes` x 1 x 1
// (the data's classes); an error names that layer's file line or the preset.
// Callers check the labels against graph.classes() first, so that a bad
// label (which makes the data seem to have more classes) is named as such.
void check_model_output(const Config& config, const worker::Graph& graph,
                        const worker::Shape& input, int64_t classes);

// What training allocates at least: the parameters and their gradients, and
// the largest layer output for a batch of `rank_batch` samples; more than
// the machine's memory on a CPU device is an error naming the layer (or the
// preset) or train.batch. Not checked: a GPU's memory (unknown before its
// backend starts) and a device.memory_limit the model outgrows, which the
// network refuses when it reserves its pool, naming what does not fit.
void check_model_fits(const Config& config, const worker::Graph& graph, const Machine& machine,
                      int64_t rank_batch);

// Once the backend training uses is made: the precision it must train in
// (train.precision: an instruction set or GPU generation it lacks, a mode
// of another backend) and a named conv.algorithm that none of the model's
// convolutions offers at a batch of `rank_batch`, each an error naming the
// key, where the network would refuse them later.
void check_backend(const Config& config, const worker::Graph& graph, worker::Backend& backend,
                   int64_t rank_batch);

}  // namespace vtrain::config
