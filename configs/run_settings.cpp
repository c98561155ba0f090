// The config values that define a training run (config.h: run_settings),
// taken from the dump, so that a key added to a section is in the list
// without being named here again.
#include <array>
#include <set>
#include <string>
#include <vector>

#include "configs/internal/config_parts.h"

namespace vtrain::config {
namespace {

// Sections whose keys define what a run trains: the model, the data and the
// optimizer; of train, the loss's label_smoothing and the ema. train.batch
// and train.seed do too, but every checkpoint holds them as fields of its
// own (checked by check_checkpoint_resumable).
constexpr std::array<const char*, 3> kDefiningSections = {"model", "data", "optimizer"};

// Keys of those sections that do not: how the data is staged, where its
// files lie (a requeued job may find a copy of them elsewhere: the
// "training set" entry stands for what they hold), the test set, and the
// starting weights (a resume continues its checkpoint's weights and never
// reads model.init again).
const std::set<std::string>& not_defining() {
  static const std::set<std::string> keys = {
      "data.prefetch",    "data.train_images", "data.train_labels", "data.train_files",
      "data.test_images", "data.test_labels",  "data.test_files",   "data.test_size",
      "model.init",       "model.init_skip"};
  return keys;
}

// Appends the leaves under `node` as "section.key" and their YAML text.
void add_leaves(const YAML::Node& node, const std::string& key,
                std::vector<worker::RunSetting>& out) {
  if (node.IsMap()) {
    for (const auto& entry : node) add_leaves(entry.second, key + "." + entry.first.Scalar(), out);
    return;
  }
  if (not_defining().contains(key)) return;
  if (node.IsScalar()) {
    out.push_back({key, node.Scalar()});
    return;
  }
  YAML::Emitter text;
  text << YAML::Flow << node;
  out.push_back({key, text.c_str()});
}

}  // namespace

std::vector<worker::RunSetting> run_settings(const Config& config, const worker::Dataset& train) {
  const YAML::Node dump = YAML::Load(to_yaml(config));
  std::vector<worker::RunSetting> settings;
  for (const char* section : kDefiningSections) add_leaves(dump[section], section, settings);
  // The loss and what the checkpoints keep beside the weights.
  for (const char* key : {"label_smoothing", "ema"}) {
    add_leaves(dump["train"][key], std::string("train.") + key, settings);
  }
  settings.push_back({"training set", common::format("%lld samples of %s, %lld classes",
                                                     static_cast<long long>(train.count),
                                                     train.sample.str().c_str(),
                                                     static_cast<long long>(train.classes))});
  return settings;
}

}  // namespace vtrain::config
