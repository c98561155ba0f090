// Command-line parsing and help for the `vtrain` executable.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "balancer/workspace_plan.h"

namespace vtrain::launcher {

// A malformed command line: exit code 2 with the message and a usage hint.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Exit codes, documented in `vtrain --help` and docs/cli.md.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,
  kExitUsage = 2,
  kExitStopped = 3,         // by a signal, after writing a checkpoint: requeue to resume
  kExitStoppedUnsaved = 4,  // by a signal with no checkpoint.dir: nothing to resume
};

struct CliArgs {
  std::string command;                 // "train", "profile", "balance", "check", "db", "evaluate",
                                       // "predict", "export", "help", "version"
  std::string help_topic;              // for "help": a command name or empty
  std::string config;                  // CONFIG path
  std::vector<std::string> overrides;  // --set key.path=value, in order
  std::string metrics;                 // --metrics FILE (overrides output.metrics)
  std::string progress;                // --progress MODE (overrides output.progress)
  bool resume = false;                 // --resume (checkpoint.resume=required)
  std::string db;                      // --db FILE (profile.db; required for `db`)
  std::string db_action;               // db: "stats" or "export"
  std::string table;                   // db export: --table NAME
  std::string format = "csv";          // db export: --format csv|jsonl; export: --format (kExportFormats)
  std::string plan;                    // train: --plan FILE (a plan to follow)
  std::string trace;                   // train: --trace FILE (Chrome trace of the first steps)
  int ranks = 0;                       // check: --ranks N (0: balance.manual's count, else 1)
  int64_t batch = 0;                   // balance: --batch B (default train.batch);
                                       // evaluate, predict: samples per forward pass
  std::string checkpoint;              // evaluate, predict, export: --checkpoint PATH (file or folder)
  std::string confusion;               // evaluate: --confusion FILE (the confusion matrix as CSV)
  bool json = false;                   // evaluate, predict: --json (JSON on stdout)
  int64_t top = 5;                     // predict: --top K (classes shown per input)
  std::vector<std::string> inputs;     // predict: INPUT... (test:N, train:N)
  std::string devices;                 // balance: --devices "name,name,..." (default: the DB's)
  std::string workspace;               // balance: --workspace SIZE (balance.workspace_limit)
  // balance: --policy undivided|wr|wd (overrides balance.workspace)
  std::optional<balancer::WorkspacePolicy> policy;
  std::string out;                     // balance: --out FILE (write the plan); export: the model file
  std::string fronts;                  // balance: --fronts FILE (Pareto fronts as CSV)
  double allreduce_ms = 0;             // balance: --allreduce-ms MS (added to every step)
  std::string data_action;             // data: "pack" or "bench"
  std::string split = "train";         // data: --split train|test
  int64_t shard_samples = 10000;       // data pack: --shard-samples N
  int64_t max_side = 0;                // data pack: --max-side N (0: store as is)
  int quality = 90;                    // data pack: --quality Q (resized JPEGs)
  int workers = 0;                     // data bench: --workers N (0: data.workers's default)
  int64_t batches = 20;                // data bench: --batches N
};

// The formats `vtrain export --format` writes.
inline constexpr const char* kExportFormats[] = {"onnx", "safetensors"};

// Throws UsageError. `vtrain CONFIG` means `vtrain train CONFIG`.
CliArgs parse_cli(const std::vector<std::string>& args);

// Help for `vtrain --help` (topic empty) or `vtrain COMMAND --help`.
std::string help_text(const std::string& topic);

}  // namespace vtrain::launcher
