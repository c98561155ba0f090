#include "launcher/evaluate_command.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/text.h"
#include "configs/config_limits.h"
#include "launcher/part_options.h"
#include "worker/data/image_files.h"
#include "worker/device/pinned_memory.h"
#include "worker/engine/network.h"
#include "worker/train/batch_gatherer.h"
#include "worker/train/checkpoint.h"
#include "worker/train/evaluate.h"
#include "worker/train/metrics.h"

namespace vtrain::launcher {
namespace {

using common::format;
using worker::JsonRecord;

// The names of the data's classes where its format fixes them (CIFAR-10's
// batches.meta.txt); empty where it does not (IDX files do not tell MNIST
// from Fashion-MNIST; synthetic classes have none): then the index names a
// class.
std::vector<std::string> class_names(const config::Config& cfg) {
  if (cfg.data.kind == worker::DataKind::kCifar10) {
    return {"airplane", "automobile", "bird", "cat", "deer",
            "dog",      "frog",       "horse", "ship", "truck"};
  }
  return {};
}

// "3 (cat)", or "3" where the class has no name.
std::string class_text(const std::vector<std::string>& names, int64_t c) {
  const auto i = static_cast<size_t>(c);
  return i < names.size() ? format("%lld (%s)", static_cast<long long>(c), names[i].c_str())
                          : std::to_string(c);
}

// {"class": c, "name": ...}: the name only where the class has one.
JsonRecord class_record(const std::vector<std::string>& names, int64_t c) {
  JsonRecord r;
  r.add("class", c);
  if (static_cast<size_t>(c) < names.size()) r.add("name", names[static_cast<size_t>(c)]);
  return r;
}

// Samples per forward pass: --batch, else train.batch; never more than
// `count` (the network is built for it), at least 1.
int64_t forward_batch(const CliArgs& cli, const config::Config& cfg, int64_t count) {
  const int64_t batch = cli.batch > 0 ? cli.batch : cfg.train.batch;
  return std::max<int64_t>(1, std::min(batch, count));
}

// The network for inference at up to `max_batch` samples: the config's
// memory policy, and each convolution's least-workspace algorithm (or
// conv.algorithm when it names one), untimed, so that the figures do not
// depend on which algorithm a timing happened to favour.
std::unique_ptr<worker::Network> inference_network(const TrainedModelSetup& setup,
                                                   worker::Backend& backend, int64_t max_batch) {
  config::check_backend(setup.cfg, setup.graph, backend, max_batch);
  worker::NetworkOptions options = network_options(setup.cfg, max_batch);
  options.allocations_after_network.clear();  // no optimizer, no gradient exchange
  options.time_convolutions = false;
  return std::make_unique<worker::Network>(setup.graph, backend, options);
}

// The checkpoint a command scores, on rank 0 (the others get "" and 0).
struct LoadedCheckpoint {
  std::string path;
  int64_t step = 0;
};

// Puts the model state of the checkpoint --checkpoint names into `net`, as
// a resume does (trainer_checkpoint.cpp): rank 0 reads it and checks that
// it belongs to this model, then every rank gets its parameters and
// batch-norm statistics. Collective over `comm` when given.
LoadedCheckpoint load_model_state(const std::string& where, worker::Network& net,
                                  worker::Communicator* comm) {
  LoadedCheckpoint loaded;
  std::vector<float> parameters, buffers;
  if (comm == nullptr || comm->rank() == 0) {
    loaded.path = worker::checkpoint_at(where);
    worker::Checkpoint ckpt = worker::load_checkpoint(loaded.path);
    worker::check_checkpoint_matches(ckpt, loaded.path, net.graph().signature(),
                                     net.parameter_count(), net.buffer_count());
    loaded.step = ckpt.step;
    parameters = std::move(ckpt.parameters);
    buffers = std::move(ckpt.buffers);
  }
  if (comm != nullptr) {
    comm->broadcast(parameters, 0);
    comm->broadcast(buffers, 0);
  }
  net.upload_parameters(parameters);
  net.upload_buffers(buffers);
  return loaded;
}

// --confusion: a row per label, a column per top-1 class.
void write_confusion(const std::string& path, const worker::EvaluationCounts& counts) {
  const auto row = [&](const std::string& first, auto cell) {
    std::string line = first;
    for (int64_t c = 0; c < counts.classes; ++c) line.append(",").append(std::to_string(cell(c)));
    return line + "\n";
  };
  std::string csv = row("label", [](int64_t c) { return c; });
  for (int64_t label = 0; label < counts.classes; ++label) {
    csv += row(std::to_string(label), [&](int64_t c) {
      return counts.confusion[static_cast<size_t>(label * counts.classes + c)];
    });
  }
  common::write_file_whole(path, csv, "confusion matrix");
}

JsonRecord evaluation_json(const LoadedCheckpoint& from, const worker::EvaluationCounts& e,
                           const std::vector<std::string>& names) {
  std::vector<JsonRecord> per_class;
  for (int64_t c = 0; c < e.classes; ++c) {
    const double accuracy = e.class_accuracy(c);
    per_class.push_back(class_record(names, c)
                            .add("samples", e.per_class_samples[static_cast<size_t>(c)])
                            .add("correct", e.per_class_top1[static_cast<size_t>(c)])
                            .add("accuracy", accuracy >= 0 ? accuracy : std::nan("")));
  }
  JsonRecord r;
  r.add("checkpoint", from.path)
      .add("step", from.step)
      .add("samples", e.samples)
      .add("classes", e.classes)
      .add("loss", e.loss())
      .add("accuracy", e.accuracy())
      .add("top5_accuracy", e.top5_accuracy())
      .add("correct", e.top1)
      .add("top5_correct", e.top5)
      .add("per_class", std::span<const JsonRecord>(per_class));
  return r;
}

void print_evaluation(const LoadedCheckpoint& from, const worker::EvaluationCounts& e,
                      const std::vector<std::string>& names, const std::string& setup_line) {
  std::printf("checkpoint: %s (step %lld)\n%s\n", from.path.c_str(),
              static_cast<long long>(from.step), setup_line.c_str());
  std::printf("loss %.4g  top-1 %.4f (%lld/%lld)  top-5 %.4f (%lld/%lld)\n", e.loss(),
              e.accuracy(), static_cast<long long>(e.top1), static_cast<long long>(e.samples),
              e.top5_accuracy(), static_cast<long long>(e.top5), static_cast<long long>(e.samples));
  std::printf("  %-18s %8s %8s\n", "class", "samples", "top-1");
  for (int64_t c = 0; c < e.classes; ++c) {
    const double accuracy = e.class_accuracy(c);
    std::printf("  %-18s %8lld %8s\n", class_text(names, c).c_str(),
                static_cast<long long>(e.per_class_samples[static_cast<size_t>(c)]),
                accuracy >= 0 ? format("%.4f", accuracy).c_str() : "-");
  }
}

// One input predict classifies: where its sample is and how the command
// line named it.
struct PredictInput {
  std::string text;
  const worker::Dataset* data = nullptr;
  int64_t index = 0;
  int32_t label = -1;  // the sample's own; -1 for an image file, which has none
};

// The image files named on the command line, as a dataset of the
// network's input shape that goes through the config's evaluation
// transform (data.test_transform), as the test set does.
struct ImageInputs {
  std::shared_ptr<worker::ImageFiles> files = std::make_shared<worker::ImageFiles>();
  worker::Dataset data;
  explicit ImageInputs(const TrainedModelSetup& setup) {
    data.sample = setup.test.sample;
    data.classes = setup.graph.classes();
    data.transform = setup.cfg.data.test_transform;
    data.files = files;
  }
};

// The one place an INPUT is read. Its forms: test:INDEX and train:INDEX, a
// sample of the config's data; or the path of a JPEG or PNG file, added to
// `images` (decoded when the batch is gathered: a file that is neither is
// a data error naming it).
PredictInput predict_input(const std::string& arg, const TrainedModelSetup& setup,
                           ImageInputs& images) {
  const size_t colon = arg.find(':');
  const std::string set = arg.substr(0, colon);
  if (colon == std::string::npos || (set != "test" && set != "train")) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(arg, error)) {
      throw UsageError("predict: INPUT '" + arg + "' is none of the forms predict reads: "
                       "test:INDEX or train:INDEX (sample INDEX of the config's test or "
                       "training data, from 0), or the path of a JPEG or PNG file");
    }
    images.files->add_file(arg);
    images.data.labels.push_back(0);  // the loss step needs one; not shown
    return {arg, &images.data, images.data.count++, -1};
  }
  const worker::Dataset& data = set == "test" ? setup.test : setup.train;
  const std::string digits = arg.substr(colon + 1);
  int64_t index = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  const bool number = error == std::errc() && end == digits.data() + digits.size() && index >= 0;
  if (!number || index >= data.count) {
    throw UsageError("predict: INPUT '" + arg + "': INDEX must be a whole number from 0 to " +
                     std::to_string(data.count - 1) + " (the " + set + " data has " +
                     std::to_string(data.count) + " samples)");
  }
  return {arg, &data, index, data.labels[static_cast<size_t>(index)]};
}

// The inputs' scores, n x classes, in `chunk`s of the network's batch;
// each sample through its dataset's transform, as evaluation gathers it.
std::vector<float> predict_scores(worker::Network& net, const std::vector<PredictInput>& inputs,
                                  const worker::ChannelStats& norm, worker::Staging& stage,
                                  int64_t chunk, uint64_t seed) {
  const int64_t classes = net.graph().classes();
  const int64_t per_sample = inputs.front().data->sample.per_sample();
  const auto count = static_cast<int64_t>(inputs.size());
  std::vector<float> scores(static_cast<size_t>(count * classes));
  for (int64_t at = 0; at < count; at += chunk) {
    const int64_t n = std::min(chunk, count - at);
    stage.indices.resize(static_cast<size_t>(n));
    stage.images.resize(static_cast<size_t>(n * per_sample));
    stage.labels.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const PredictInput& in = inputs[static_cast<size_t>(at + i)];
      stage.indices[i] = in.index;
      worker::gather_batch(*in.data, std::span<const int64_t>(&in.index, 1), norm,
                           worker::SampleDraw{seed, 0}, stage.images.data() + i * per_sample,
                           stage.labels.data() + i);
    }
    worker::upload_staged(net, stage);
    net.evaluate(n, scores.data() + at * classes);
  }
  return scores;
}

}  // namespace

int run_evaluate(const CliArgs& cli, const TrainedModelSetup& setup, worker::Communicator& comm) {
  if (setup.test.count == 0) {
    throw config::ConfigError(setup.cfg.path + ": the test set is empty: nothing to evaluate");
  }
  const int64_t chunk = forward_batch(cli, setup.cfg, setup.test.count);
  const auto backend = worker::make_backend(backend_options(setup.cfg));
  const std::unique_ptr<worker::Network> net = inference_network(setup, *backend, chunk);
  const LoadedCheckpoint from = load_model_state(cli.checkpoint, *net, &comm);
  worker::PinnedMemory pinned(*backend);
  worker::Staging stage(&pinned);
  const worker::EvaluationCounts counts =
      worker::evaluate(*net, setup.test, setup.norm, stage,
                       {.chunk = chunk, .share_unit = chunk, .confusion = true, .comm = &comm});
  if (comm.rank() == 0) {
    const std::vector<std::string> names = class_names(setup.cfg);
    if (!cli.confusion.empty()) write_confusion(cli.confusion, counts);
    if (cli.json) {
      std::printf("%s\n", evaluation_json(from, counts, names).str().c_str());
    } else {
      print_evaluation(from, counts, names,
                       format("test set: %lld samples of %s, %lld classes; %d rank%s, forward "
                              "batches of %lld",
                              static_cast<long long>(setup.test.count),
                              setup.test.sample.str().c_str(),
                              static_cast<long long>(counts.classes), comm.size(),
                              comm.size() == 1 ? "" : "s", static_cast<long long>(chunk)));
      if (!cli.confusion.empty()) std::printf("confusion matrix: wrote %s\n", cli.confusion.c_str());
    }
    std::fflush(stdout);
  }
  // Rank 0's output can still fail (--confusion on a full disk): the
  // others wait here, so that its error ends the whole job.
  comm.barrier();
  return kExitOk;
}

int run_predict(const CliArgs& cli, const TrainedModelSetup& setup) {
  ImageInputs images(setup);
  std::vector<PredictInput> inputs;
  for (const std::string& arg : cli.inputs) inputs.push_back(predict_input(arg, setup, images));
  const int64_t chunk = forward_batch(cli, setup.cfg, static_cast<int64_t>(inputs.size()));
  const auto backend = worker::make_backend(backend_options(setup.cfg));
  const std::unique_ptr<worker::Network> net = inference_network(setup, *backend, chunk);
  const LoadedCheckpoint from = load_model_state(cli.checkpoint, *net, nullptr);
  worker::PinnedMemory pinned(*backend);
  worker::Staging stage(&pinned);
  const std::vector<float> scores =
      predict_scores(*net, inputs, setup.norm, stage, chunk, setup.cfg.train.seed);
  const int64_t classes = setup.graph.classes();
  const std::vector<std::string> names = class_names(setup.cfg);
  std::vector<JsonRecord> predictions;
  if (!cli.json) std::printf("checkpoint: %s (step %lld)\n", from.path.c_str(), static_cast<long long>(from.step));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::span<const float> z(scores.data() + i * static_cast<size_t>(classes), static_cast<size_t>(classes));
    const std::vector<double> p = worker::softmax(z);
    const std::vector<int64_t> top = worker::ranked_classes(z, cli.top);
    std::vector<JsonRecord> ranked;
    const int32_t label = inputs[i].label;
    if (!cli.json) {
      std::printf("%s: label %s\n", inputs[i].text.c_str(),
                  label >= 0 ? class_text(names, label).c_str() : "- (an image file)");
    }
    for (int64_t c : top) {
      ranked.push_back(class_record(names, c).add("probability", p[static_cast<size_t>(c)]));
      if (!cli.json) std::printf("  %-10.4g %s\n", p[static_cast<size_t>(c)], class_text(names, c).c_str());
    }
    JsonRecord prediction;
    prediction.add("input", inputs[i].text);
    if (label >= 0) prediction.add("label", static_cast<int64_t>(label));
    predictions.push_back(prediction.add("top", std::span<const JsonRecord>(ranked)));
  }
  if (cli.json) {
    std::printf("%s\n", JsonRecord()
                            .add("checkpoint", from.path)
                            .add("step", from.step)
                            .add("predictions", std::span<const JsonRecord>(predictions))
                            .str()
                            .c_str());
  }
  return kExitOk;
}

}  // namespace vtrain::launcher
