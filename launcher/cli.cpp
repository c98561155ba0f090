#include "launcher/cli.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <cmath>
#include <optional>
#include <string>
#include <system_error>

#include "perfdb/perf_db.h"

namespace vtrain::launcher {
namespace {

const char* kCommands[] = {"train",    "profile", "balance", "check", "db",     "data",
                           "evaluate", "predict", "export",  "help",  "version"};

bool is_command(const std::string& s) {
  for (const char* c : kCommands) {
    if (s == c) return true;
  }
  return false;
}

}  // namespace

namespace {

// The words after the command, one at a time.
class ArgReader {
 public:
  ArgReader(const std::vector<std::string>& args, size_t first) : args_(args), i_(first) {}
  bool done() const { return i_ >= args_.size(); }
  const std::string& next() { return args_[i_++]; }
  // The value after `flag`. An empty one is refused: for a file it would
  // read as "not given" (--plan "" trains without the plan).
  const std::string& value(const std::string& flag) {
    if (done()) throw UsageError(flag + " needs a value");
    const std::string& v = next();
    if (v.empty()) throw UsageError(flag + " needs a value, got an empty one");
    return v;
  }

 private:
  const std::vector<std::string>& args_;
  size_t i_;
};

// The command (train when the first word is a config); returns the index
// of the first word after it. help and version are complete here.
size_t parse_command(const std::vector<std::string>& args, CliArgs& cli) {
  if (args.empty()) throw UsageError("no command or config given");
  if (args[0] == "--help" || args[0] == "-h") {
    cli.command = "help";
    return args.size();
  }
  if (args[0] == "--version") {
    cli.command = "version";
    return args.size();
  }
  if (is_command(args[0])) {
    cli.command = args[0];
    return 1;
  }
  if (!args[0].empty() && args[0][0] == '-') {
    throw UsageError("unknown option '" + args[0] + "' before the command");
  }
  cli.command = "train";  // `vtrain CONFIG`
  return 0;
}

// The number `v` is when it is one and nothing else: no blanks on either
// side (" 3" and "3 " alike), no sign, no hex; nullopt otherwise.
template <typename Number>
std::optional<Number> exact_number(const std::string& v) {
  Number n{};
  const char* last = v.data() + v.size();
  const auto [end, error] = std::from_chars(v.data(), last, n);
  if (error != std::errc() || end != last) return std::nullopt;
  return n;
}

// "onnx" or "onnx, safetensors": what export --format takes.
std::string export_formats() {
  std::string s;
  for (const char* f : kExportFormats) s += (s.empty() ? "" : ", ") + std::string(f);
  return s;
}

bool is_export_format(const std::string& f) {
  return std::find(std::begin(kExportFormats), std::end(kExportFormats), f) !=
         std::end(kExportFormats);
}

int64_t positive_integer(const std::string& flag, const std::string& v) {
  const std::optional<int64_t> n = exact_number<int64_t>(v);
  if (!n || *n < 1) throw UsageError(flag + " expects a positive integer, got '" + v + "'");
  return *n;
}

// balance's own options; false when `a` is none of them.
bool parse_balance_option(const std::string& a, ArgReader& in, CliArgs& cli) {
  if (a == "--config") {
    cli.config = in.value(a);
  } else if (a == "--batch") {
    cli.batch = positive_integer(a, in.value(a));
  } else if (a == "--devices") {
    cli.devices = in.value(a);
    if (cli.devices.find_first_not_of(" \t,") == std::string::npos) {
      throw UsageError("--devices names no device (give \"NAME,NAME,...\", or leave it out to "
                       "use every device the DB measured)");
    }
  } else if (a == "--workspace") {
    cli.workspace = in.value(a);
  } else if (a == "--policy") {
    const std::string& v = in.value(a);
    cli.policy = common::find_named(balancer::kWorkspacePolicyNames, v);
    if (!cli.policy) {
      throw UsageError("--policy must be one of " +
                       common::join(common::names_of(balancer::kWorkspacePolicyNames)) +
                       ", got '" + v + "'");
    }
  } else if (a == "--out") {
    cli.out = in.value(a);
  } else if (a == "--fronts") {
    cli.fronts = in.value(a);
  } else if (a == "--allreduce-ms") {
    const std::string& v = in.value(a);
    const std::optional<double> ms = exact_number<double>(v);
    if (!ms || !(*ms >= 0) || !std::isfinite(*ms)) {
      throw UsageError("--allreduce-ms must be a number of milliseconds >= 0, got '" + v + "'");
    }
    cli.allreduce_ms = *ms;
  } else {
    return false;
  }
  return true;
}

// evaluate's and predict's own options; false when `a` is none of them.
bool parse_model_option(const std::string& a, ArgReader& in, CliArgs& cli) {
  const bool evaluate = cli.command == "evaluate";
  if (a == "--checkpoint") {
    cli.checkpoint = in.value(a);
  } else if (a == "--json") {
    cli.json = true;
  } else if (a == "--batch") {
    cli.batch = positive_integer(a, in.value(a));
  } else if (a == "--confusion" && evaluate) {
    cli.confusion = in.value(a);
  } else if (a == "--top" && !evaluate) {
    cli.top = positive_integer(a, in.value(a));
  } else {
    return false;
  }
  return true;
}

// export's own options; false when `a` is none of them.
bool parse_export_option(const std::string& a, ArgReader& in, CliArgs& cli) {
  if (a == "--checkpoint") {
    cli.checkpoint = in.value(a);
  } else if (a == "--out") {
    cli.out = in.value(a);
  } else if (a == "--format") {
    cli.format = in.value(a);
    if (!is_export_format(cli.format)) {
      throw UsageError("--format must be one of " + export_formats() + ", got '" + cli.format +
                       "'");
    }
  } else {
    return false;
  }
  return true;
}

// data's own options (--out, --batch shared with balance's meaning of a
// file and a batch); false when `a` is none of them.
bool parse_data_option(const std::string& a, ArgReader& in, CliArgs& cli) {
  auto number = [&](int64_t most) {
    const int64_t n = positive_integer(a, in.value(a));
    if (n > most) throw UsageError(a + " expects at most " + std::to_string(most) + ", got " + std::to_string(n));
    return n;
  };
  if (a == "--out" && cli.data_action == "pack") {
    cli.out = in.value(a);
  } else if (a == "--split") {
    cli.split = in.value(a);
    if (cli.split != "train" && cli.split != "test") throw UsageError("--split must be train or test, got '" + cli.split + "'");
  } else if (a == "--shard-samples" && cli.data_action == "pack") {
    cli.shard_samples = number(int64_t{1} << 30);
  } else if (a == "--max-side" && cli.data_action == "pack") {
    cli.max_side = number(1 << 16);
  } else if (a == "--quality" && cli.data_action == "pack") {
    cli.quality = static_cast<int>(number(100));
  } else if (a == "--workers" && cli.data_action == "bench") {
    cli.workers = static_cast<int>(number(1024));
  } else if (a == "--batches" && cli.data_action == "bench") {
    cli.batches = number(int64_t{1} << 20);
  } else if (a == "--batch" && cli.data_action == "bench") {
    cli.batch = number(int64_t{1} << 20);
  } else {
    return false;
  }
  return true;
}

bool runs_a_checkpoint(const std::string& command) {
  return command == "evaluate" || command == "predict" || command == "export";
}

// Options of train, db and of every command; false when `a` is none of them.
bool parse_option(const std::string& a, ArgReader& in, CliArgs& cli) {
  const std::string& command = cli.command;
  if (a == "--set") {
    cli.overrides.push_back(in.value(a));
  } else if (a.rfind("--set=", 0) == 0) {
    cli.overrides.push_back(a.substr(6));
  } else if (a == "--metrics") {
    cli.metrics = in.value(a);
  } else if (a == "--progress") {
    cli.progress = in.value(a);
  } else if (a == "--resume" && command == "train") {
    cli.resume = true;
  } else if (a == "--db" && command != "train" && command != "check" &&
             !runs_a_checkpoint(command)) {
    cli.db = in.value(a);
  } else if (a == "--plan" && command == "train") {
    cli.plan = in.value(a);
  } else if (a == "--trace" && command == "train") {
    cli.trace = in.value(a);
  } else if (a == "--ranks" && command == "check") {
    const std::string& v = in.value(a);
    const std::optional<int> n = exact_number<int>(v);
    if (!n || *n < 1 || *n > 1 << 20) {
      throw UsageError("--ranks must be a whole number of ranks >= 1, got '" + v + "'");
    }
    cli.ranks = *n;
  } else if (a == "--table" && command == "db") {
    cli.table = in.value(a);
  } else if (a == "--format" && command == "db") {
    cli.format = in.value(a);
    if (cli.format != "csv" && cli.format != "jsonl") {
      throw UsageError("--format must be csv or jsonl, got '" + cli.format + "'");
    }
  } else if (command == "export") {
    return parse_export_option(a, in, cli);
  } else if (runs_a_checkpoint(command)) {
    return parse_model_option(a, in, cli);
  } else if (command == "data") {
    return parse_data_option(a, in, cli);
  } else {
    return command == "balance" && parse_balance_option(a, in, cli);
  }
  return true;
}

// What every command needs once its words are read.
void check_complete(const CliArgs& cli) {
  for (const std::string& o : cli.overrides) {
    if (o.find('=') == std::string::npos || o.front() == '=') {
      throw UsageError("--set expects key.path=value, got '" + o + "'");
    }
  }
  if (cli.command == "db") {
    if (cli.db.empty()) throw UsageError("db " + cli.db_action + " needs --db FILE");
    if (cli.db_action == "export" && cli.table.empty()) {
      throw UsageError("db export needs --table NAME (" + perfdb::table_names() + ")");
    }
    return;
  }
  if (cli.config.empty()) throw UsageError("'" + cli.command + "' needs a CONFIG file");
  if (runs_a_checkpoint(cli.command) && cli.checkpoint.empty()) {
    throw UsageError(cli.command + " needs --checkpoint PATH (a checkpoint file, or the "
                     "checkpoint.dir folder: its newest)");
  }
  if (cli.command == "export") {
    // cli.format still holds db's default when --format was not given.
    if (!is_export_format(cli.format)) {
      throw UsageError("export needs --format FORMAT (" + export_formats() + ")");
    }
    if (cli.out.empty()) throw UsageError("export needs --out FILE (the model file to write)");
  }
  if (cli.command == "data" && cli.data_action == "pack" && cli.out.empty()) {
    throw UsageError("data pack needs --out PREFIX (shards are written as PREFIX-000000.tar, ...)");
  }
  if (cli.command == "balance" && cli.db.empty()) {
    throw UsageError("balance needs --db FILE (the perf DB that `vtrain profile` filled)");
  }
  if (cli.command == "predict" && cli.inputs.empty()) {
    throw UsageError("predict needs at least one INPUT after the config (test:INDEX or "
                     "train:INDEX: a sample of the config's data; or a JPEG or PNG file)");
  }
}

}  // namespace

CliArgs parse_cli(const std::vector<std::string>& args) {
  CliArgs cli;
  ArgReader in(args, parse_command(args, cli));
  if (cli.command == "help") {
    if (!in.done()) cli.help_topic = in.next();
    if (!in.done()) throw UsageError("help takes at most one topic");
    return cli;
  }
  if (cli.command == "version") {
    if (!in.done()) throw UsageError("version takes no arguments");
    return cli;
  }
  if (cli.command == "db") {
    const std::string action = in.done() ? "" : in.next();
    if (action != "stats" && action != "export" && action != "--help" && action != "-h") {
      throw UsageError("db needs an action: stats or export (see vtrain db --help)");
    }
    if (action == "--help" || action == "-h") {
      cli.help_topic = cli.command;
      cli.command = "help";
      return cli;
    }
    cli.db_action = action;
  }
  if (cli.command == "data") {
    const std::string action = in.done() ? "" : in.next();
    if (action == "--help" || action == "-h") {
      cli.help_topic = cli.command;
      cli.command = "help";
      return cli;
    }
    if (action != "pack" && action != "bench") {
      throw UsageError("data needs an action: pack or bench (see vtrain data --help)");
    }
    cli.data_action = action;
  }
  while (!in.done()) {
    const std::string& a = in.next();
    if (a == "--help" || a == "-h") {
      cli.help_topic = cli.command;
      cli.command = "help";
      return cli;
    }
    if (parse_option(a, in, cli)) continue;
    if (!a.empty() && a[0] == '-') {
      throw UsageError("unknown option '" + a + "' for '" + cli.command + "' (see vtrain " +
                       cli.command + " --help)");
    }
    if (cli.command == "db") throw UsageError("unexpected argument '" + a + "' for db " + cli.db_action);
    if (cli.config.empty()) {
      cli.config = a;
    } else if (cli.command == "predict") {
      cli.inputs.push_back(a);  // its form is checked against the data (predict_input)
    } else {
      throw UsageError("unexpected argument '" + a + "': the config is already '" + cli.config + "'");
    }
  }
  check_complete(cli);
  return cli;
}

const char* const kEvaluateHelp =
    R"(vtrain evaluate CONFIG --checkpoint PATH [--batch B] [--json] [--confusion FILE]
                [--set KEY=VALUE]...
mpirun -np N vtrain evaluate CONFIG --checkpoint PATH ...

Scores the model of a checkpoint on CONFIG's test set: the mean loss, top-1
and top-5 accuracy (a sample counts for top-5 when its label is among its 5
highest scores; with 5 classes or fewer every sample does), and per class
the samples and their top-1 accuracy. The model is CONFIG's; a checkpoint
of another model is an error. Batch norm runs in inference form (its
running statistics). PATH is a checkpoint file or a folder (checkpoint.dir):
its newest checkpoint.

Under mpirun the test set is divided among the ranks in whole batches and
the counts added up: the figures do not depend on the number of ranks.
Each convolution runs its least-workspace algorithm (or conv.algorithm when
it names one), untimed, so that they do not depend on timing either.
  --checkpoint PATH   the checkpoint file, or a folder: its newest
  --batch B           samples per forward pass (default train.batch)
  --json              print the figures as one JSON object (docs/evaluate.md)
  --confusion FILE    write the confusion matrix as CSV: a row per label, a
                      column per predicted class (top-1), counts
Exit codes: 0 success, 1 runtime failure (no checkpoint at PATH, a
checkpoint of another model, a file that cannot be written), 2 usage or
config error.
)";

const char* const kPredictHelp =
    R"(vtrain predict CONFIG --checkpoint PATH INPUT... [--top K] [--batch B] [--json]
               [--set KEY=VALUE]...

Runs the model of a checkpoint on each INPUT and prints its K most likely
classes (default 5) with their probabilities (softmax of the scores) and
names where the data has them (CIFAR-10's classes), else class indexes.
INPUT is a sample of CONFIG's data or an image file:
  test:INDEX    sample INDEX of the test set (from 0); its label is shown
  train:INDEX   sample INDEX of the training set
  FILE          a JPEG or PNG file, through data.test_transform (resized and
                cropped to the model's input, as the test set is)
each normalised as training and evaluation normalise it.
  --checkpoint PATH   the checkpoint file, or a folder: its newest
  --top K             classes shown per input (at most the model's classes)
  --batch B           inputs per forward pass (default train.batch)
  --json              print one JSON object (docs/evaluate.md)
Exit codes: 0 success, 1 runtime failure (no checkpoint at PATH, a
checkpoint of another model, a FILE that is not a readable JPEG or PNG),
2 usage or config error (an INPUT of none of these forms, an INDEX outside
the data).
)";

std::string help_text(const std::string& topic) {
  if (topic.empty() || topic == "help") {
    return R"(vtrain - data-parallel CNN training for mixed devices

Usage:
  vtrain CONFIG [options]          same as `vtrain train CONFIG`
  vtrain train CONFIG [options]    train the model the config describes
  vtrain profile CONFIG [--db FILE] measure kernels and steps into the perf DB
  vtrain balance CONFIG --db FILE [--batch B] [--devices "A,B,..."] [--policy P]
                 [--workspace SIZE] [--out PLAN]   plan a split offline (what-if)
  vtrain db stats --db FILE        what the perf DB holds
  vtrain db export --db FILE --table NAME [--format csv|jsonl]
  vtrain data pack CONFIG --out PREFIX [--split S] [--shard-samples N] [--max-side N]
                 [--quality Q]     the config's data (image folder, IDX, CIFAR-10) into tar shards
  vtrain data bench CONFIG [--split S] [--workers N] [--batch B] [--batches N]
                                   the input pipeline alone: images/s of decode + transform
  vtrain check CONFIG [options]    validate the config, build the model, print a summary
  vtrain evaluate CONFIG --checkpoint PATH [--json] [--confusion FILE]
                                   score a checkpoint on the test set (loss, top-1,
                                   top-5, per class; mpirun -np N splits the set)
  vtrain predict CONFIG --checkpoint PATH INPUT... [--top K] [--json]
                                   the top classes of samples (INPUT: test:N, train:N, FILE)
  vtrain export CONFIG --checkpoint PATH --format onnx|safetensors --out FILE
                                   write a trained model for other tools
  vtrain help [COMMAND]            this help, or a command's
  vtrain --version

Options for train and check:
  --set KEY.PATH=VALUE   override a config value (repeatable; VALUE is YAML,
                         e.g. --set train.batch=32 --set data.mean=[0.5];
                         NAME[I] is entry I of a list: model.layers[2].out=64)
  --metrics FILE         write JSON-lines metrics to FILE (output.metrics)
  --progress MODE        auto | line | off (output.progress; off: no step lines)
  --resume               continue from the newest checkpoint in checkpoint.dir
                         (checkpoint.resume: required; auto starts afresh
                         where there is none)
  --plan FILE            (train) follow this plan (from `vtrain balance --out`)
  --trace FILE           (train) Chrome trace of the first 20 steps (compute and
                         memory streams, one process per rank)
  -h, --help             help for the command

Several ranks: `mpirun -np N vtrain train CONFIG` (rank 0 logs and writes
checkpoints and metrics). On SLURM: `sbatch scripts/vtrain.sbatch CONFIG`.

Exit codes: 0 success, 1 runtime failure, 2 usage or config error,
3 stopped by SIGTERM/SIGUSR1 after writing a checkpoint (requeue to resume),
4 stopped by a signal with no checkpoint.dir (nothing to resume).
Configs: see configs/*.yaml; every key is in docs/config.md, every flag in docs/cli.md.
)";
  }
  if (topic == "train") {
    return R"(vtrain train CONFIG [--set KEY=VALUE]... [--metrics FILE] [--progress MODE] [--resume]
             [--plan FILE] [--trace FILE]
mpirun -np N vtrain train CONFIG ...

Trains the model in CONFIG on its data: every epoch draws a seeded shuffle,
runs SGD steps over mini-batches of train.batch samples, and evaluates the
test set (train.evaluate). Progress goes to stdout (rank 0 only): a live line
on a terminal, a log line every train.log_every steps otherwise.

With N ranks each global batch is cut into contiguous per-rank slices
(balance.split: even; manual with balance.manual: [b0, b1, ...]; or auto:
every rank profiles its device into the perf DB (profile.*), rank 0 solves
the batch-split ILP and the convolution workspace plan (balance.workspace:
undivided | wr | wd, balance.workspace_limit) and broadcasts the plan, written
to output.plan when set; --plan FILE follows a saved plan instead); the
gradients are summed over ranks in buckets of train.allreduce_bucket bytes
while backward still runs, so the update equals single-process training on
the whole batch.

Checkpoints (checkpoint.dir, every checkpoint.every steps and at the end,
the run's newest checkpoint.keep kept) hold the model, optimizer state, data
position and the run they belong to. A run started afresh is refused where
checkpoint.dir holds checkpoints already; --resume (checkpoint.resume:
required) continues from the newest, an error where there is none;
checkpoint.resume: auto continues where there is one and starts afresh,
saying so, where there is none. A resume with other model, data or
optimizer settings is refused naming them. On
SIGTERM or SIGUSR1 the run finishes its step, writes a checkpoint and exits
with code 3 (code 4 without a checkpoint.dir: nothing to resume).

Memory (memory.policy): none allocates every tensor once; all / conv (vDNN)
allocate layer by layer, release dead tensors and offload layer inputs (of
every layer / of conv layers) to host memory during forward, prefetching
them back in backward; dyn picks the fastest of those, and the convolution
algorithms, that fits the device (device.memory_limit on the CPU); auto,
memonger, superneurons and tflms plan per tensor what to keep, swap to host
memory or recompute in backward (see `vtrain check --help`).
memory.planner: pool (best fit) or static (a DSA plan of the step's trace).

Metrics (JSON lines, --metrics or output.metrics): one object per logged step
({"event": "step", ...}), one per epoch ({"event": "epoch", ...,
"test_accuracy"}), and a final {"event": "end", "test_accuracy",
"images_per_second", "peak_device_bytes", "steps", "final_loss", ...}
(docs/metrics.md lists every field).

Options:
  --set KEY.PATH=VALUE   override any config value, e.g. --set optimizer.lr=0.1
                         or --set model.layers[2].out=64 (entry 2 of a list)
  --metrics FILE         JSON-lines metrics file
  --progress MODE        auto (live line on a TTY) | line | off (no step lines;
                         log lines such as "resumed from" still print)
  --resume               continue from the newest checkpoint in checkpoint.dir
                         (an error where there is none)
  --plan FILE            follow a plan (`vtrain balance --out`, or output.plan of
                         an earlier run); a plan for another model, rank count,
                         batch or devices is an error
  --trace FILE           write a Chrome trace (chrome://tracing, ui.perfetto.dev)
                         of the first 20 steps: per layer the compute spans and
                         the memory stream's offloads, prefetches and releases,
                         and device bytes in use; one process per rank

Exit codes: 0 success, 1 runtime failure (bad data file, out of memory, a
failed rank, ...), 2 usage or config error, 3 stopped by a signal after
writing a checkpoint, 4 stopped by a signal with no checkpoint.dir.
)";
  }
  if (topic == "profile") {
    return R"(vtrain profile CONFIG [--db FILE] [--set KEY=VALUE]...
mpirun -np N vtrain profile CONFIG ...

Measures what the balancer needs and the performance database does not hold
yet for this device, and records it (SQLite, profile.db, default perf.db
beside the config; share one file between all nodes):
  - every convolution kernel of the model (layer x Forward, BackwardData,
    BackwardFilter) with every available algorithm at every micro-batch size
    of profile.micro_batches (all | powerOfTwo | undivided), for each
    per-rank batch in profile.batches: median of profile.repeats runs after
    profile.warmup, and the workspace it needs;
  - one whole training step per batch (profile.steps): the batch's upload,
    forward, backward and SGD update (the gradient exchange is timed on its
    own in training), with its peak device memory.
Measurements the DB already has for this device and library version are not
taken again. Under mpirun every rank profiles its own device; ranks with
identical GPUs on one host split the work, and CPU ranks sharing a host's
cores measure every item together (each under the contention training meets).
)";
  }
  if (topic == "balance") {
    return R"(vtrain balance CONFIG --db FILE [--batch B] [--devices "NAME,NAME,..."]
               [--policy undivided|wr|wd] [--workspace SIZE] [--out PLAN] [--fronts CSV]
               [--allreduce-ms MS] [--set ...]
(--config CONFIG is the same as the positional CONFIG.)

Plans a job offline from the perf DB, without touching a device: the split
of the global batch B (default train.batch) over the devices (the batch-split
ILP of mu-cuDNN Sec. III-E, on the step times and peak memory the profiler
recorded under memory.policy; balance.granularity; a batch must fit the
device's memory; every rank's batch is one the profiler measured, since
offline no device can time an interpolated batch's kernels, whatever
balance.candidates says), and for each device every
convolution kernel's micro-batches and algorithms under the workspace policy:
  undivided  the fastest single call per kernel (within --workspace if given)
  wr         per kernel, the fastest micro-batch configuration whose calls
             each fit --workspace (workspace reuse)
  wd         one buffer of --workspace bytes per device divided among all
             kernels by the 0-1 ILP over their Pareto fronts (workspace
             division)
--devices names devices the DB knows (`vtrain db stats`), one entry per rank,
separated by commas (commas inside parentheses, as in X (cpus 0,1), belong
to the name); repeat a name for several identical devices (what if I add a
second one?). A CPU device's name ends with its thread count, X (2 threads);
the name without it serves where the DB has that CPU at one thread count.
Default: every device in the DB that has step measurements of this model.
An entry may end with its input for a what-if: NAME[input=IMAGES_PER_S], or
NAME[workers=N] (the DB's measured input rate per worker on that device's
host, times N up to its cores: what if this node had 8 decoding cores?);
the split then takes that device's step as the larger of its compute and
its input time (docs/balancing.md, Input rate).

Prints the split with each device's predicted step time, the speedup over an
even split, and the per-kernel choices and workspace; --out writes the plan
(YAML) for `vtrain train --plan`; --fronts writes every kernel's Pareto front
(time x workspace) as CSV with the chosen points marked
(scripts/plot_balance.py draws the split and a front). --allreduce-ms adds
the gradient allreduce every step pays once to the split's step time (training
with balance.split: auto measures it; offline it is yours to give, default 0).
)";
  }
  if (topic == "db") {
    return R"(vtrain db stats --db FILE
vtrain db export --db FILE --table NAME [--format csv|jsonl]

stats: the schema version, row counts and measurements per device.
export: one table (devices, kernels, kernel_measurements, step_measurements,
copy_bandwidth, layer_measurements, input_rates) to stdout as CSV (default) or JSON lines. The file is plain SQLite: the
sqlite3 shell reads it too (see perfdb/README.md for the tables).
)";
  }
  if (topic == "check") {
    return R"(vtrain check CONFIG [--ranks N] [--set KEY=VALUE]...

Validates CONFIG (every key, type and value), loads the data files' headers
and data, builds the model graph, and prints the layers with their output
shapes, the parameter count and the effective configuration. It refuses
what training would: it makes the backend training uses and checks
train.precision and a named conv.algorithm against it, then builds the
network on this device as training would (the batch of one rank: the
largest balance.manual entry, or train.batch / N) and prints what its
memory.policy reserves. Whether memory fits is decided on each
convolution's least-workspace algorithm, so check needs no timing for it.
Under a per-tensor memory.policy (auto, memonger, superneurons, tflms) it
takes each layer's time and the copy bandwidth from profile.db or measures
them in place (3 steps), and prints the memory plan: per activation kept,
offloaded or recomputed, the predicted step time and peak.
  --ranks N   plan for one rank of an N-rank job (default: as many ranks as
              balance.manual has entries, else 1): its share of the batch,
              and the staging a train.gradient_allreduce: half exchange
              holds on the device beside the network
Nothing is trained. Exit code 0 if the run would start, 2 for a config or
model error, 1 for a data error or a device.memory_limit no plan fits (the
error names the tensor that does not fit and the least device.memory_limit
that would, which trains).
)";
  }
  if (topic == "export") {
    return R"(vtrain export CONFIG --checkpoint PATH --format FORMAT --out FILE [--set KEY=VALUE]...

Writes the model of CONFIG with the weights of a checkpoint to FILE, for
other tools. PATH is a checkpoint file (ckpt-*.vtc) or a checkpoint folder,
whose newest checkpoint is taken; it must belong to CONFIG's model (the
data is loaded to size the model, as training does).
  --format onnx   an ONNX model, opset 17 (docs/onnx.md): one node per layer
                  (Conv, BatchNormalization in inference form, Relu, MaxPool,
                  AveragePool, GlobalAveragePool, Flatten + Gemm, Add,
                  Concat), input N x C x H x W named after the input layer,
                  output N x classes; the evaluation preprocessing (mean, std,
                  input_shape, classes) in its metadata_props. Checked with
                  the ONNX checker before it is written.
  --format safetensors
                  parameters and batch-norm running statistics as F32
                  tensors (torch: safetensors.torch.load_file). The presets
                  that are torchvision's architectures (resnet18, resnet50,
                  vgg16, alexnet) get torchvision's state_dict names, so that
                  torchvision.models.resnet50().load_state_dict(...) takes
                  the file; other models get vtrain's layer names
                  (<layer>.weight, .bias, .running_mean, .running_var). It is
                  also what model.init reads (docs/weights.md).
  --out FILE      the file to write, whole or not at all
Exit codes: 0 written, 1 a checkpoint or file that cannot be read or
written, 2 a usage or config error.
  )";
  }
  if (topic == "data") {
    return R"(vtrain data pack CONFIG --out PREFIX [--split train|test] [--shard-samples N]
                 [--max-side N] [--quality Q] [--set KEY=VALUE]...
vtrain data bench CONFIG [--split train|test] [--workers N] [--batch B] [--batches N]
                 [--set KEY=VALUE]...

pack: writes the data CONFIG's data section names (its training set, or
the test set with --split test) as WebDataset tar shards PREFIX-000000.tar,
... of --shard-samples samples (default 10000), each <key>.jpg|.png with
<key>.cls, and an index PREFIX-000000.tar.idx per shard that lets any rank
seek to its samples. Image files are copied; --max-side N stores JPEGs whose
larger side exceeds N resized to N (re-encoded at --quality, default 90), so
that every epoch decodes less; IDX and CIFAR-10 samples are stored as PNG.
bench: runs the input pipeline alone (read, decode, the split's transform,
normalise; no training) over --batches batches (default 20) of --batch
samples (default train.batch) on --workers decoding threads (default
data.workers's) and prints the images per second.
)";
  }
  if (topic == "version") return "vtrain --version: prints the version\n";
  if (topic == "evaluate") return kEvaluateHelp;
  if (topic == "predict") return kPredictHelp;
  throw UsageError("no help for '" + topic +
                   "' (commands: train, profile, balance, check, db, data, evaluate, predict, "
                   "export, help, version)");
}

}  // namespace vtrain::launcher
