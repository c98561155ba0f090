#include "configs/rank_precision.h"

#include <algorithm>

#include "common/text.h"

namespace vtrain::config {
namespace {

std::string device_text(const worker::Backend& backend) {
  const worker::DeviceInfo d = backend.device_info();
  return d.name + " (" + d.backend + ")";
}

// The precision at `key` must be offered by the device.
common::Precision require_offered(const Config& config, const std::string& key,
                                  common::Precision p, const worker::Backend& backend) {
  if (const auto why = backend.precision_unavailable(p)) {
    fail_at(config, key, *why + "; " + offers_text(backend));
  }
  return p;
}

common::Precision first_offered(const Config& config, const worker::Backend& backend) {
  for (common::Precision p : config.train.precisions) {
    if (!backend.precision_unavailable(p)) return p;
  }
  std::vector<std::string> names;
  for (common::Precision p : config.train.precisions) names.push_back(common::precision_name(p));
  fail_at(config, "train.precisions",
          "auto found none of " + common::join(names, ", ") + " on this device; " +
              offers_text(backend));
}

}  // namespace

std::vector<common::Precision> offered_precisions(const worker::Backend& backend) {
  std::vector<common::Precision> offered;
  for (const auto& named : common::kPrecisionNames) {
    if (!backend.precision_unavailable(named.value)) offered.push_back(named.value);
  }
  return offered;
}

std::string offers_text(const worker::Backend& backend) {
  std::vector<std::string> names;
  for (common::Precision p : offered_precisions(backend)) names.push_back(common::precision_name(p));
  return device_text(backend) + " offers " + (names.empty() ? "none" : common::join(names, ", "));
}

bool names_device(const std::string& name, const std::string& device) {
  return device == name || (device.starts_with(name + " (") && device.ends_with(")"));
}

common::Precision rank_precision(const Config& config, int rank, int ranks,
                                 const worker::Backend& backend) {
  const PrecisionChoice& choice = config.train.precision_choice;
  switch (choice.form) {
    case PrecisionChoice::Form::kOne:
      return require_offered(config, "train.precision", choice.one, backend);
    case PrecisionChoice::Form::kAuto: return first_offered(config, backend);
    case PrecisionChoice::Form::kPerRank: {
      if (static_cast<int>(choice.per_rank.size()) != ranks) {
        fail_at(config, "train.precision",
                "has " + std::to_string(choice.per_rank.size()) + " precisions but the job has " +
                    std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s") +
                    " (one per rank, in rank order)");
      }
      return require_offered(config, "train.precision[" + std::to_string(rank) + "]",
                             choice.per_rank[static_cast<size_t>(rank)], backend);
    }
    case PrecisionChoice::Form::kByDevice: {
      const std::string device = backend.device_info().name;
      for (const auto& [name, p] : choice.by_device) {
        if (names_device(name, device)) {
          return require_offered(config, "train.precision." + name, p, backend);
        }
      }
      return first_offered(config, backend);
    }
  }
  return common::Precision::kFp32;
}

common::Precision check_precisions(const Config& config, int ranks,
                                   const worker::Backend& backend) {
  const PrecisionChoice& choice = config.train.precision_choice;
  if (choice.form == PrecisionChoice::Form::kPerRank) {
    for (int r = 0; r < ranks; ++r) rank_precision(config, r, ranks, backend);
  }
  return rank_precision(config, 0, ranks, backend);
}

Config with_rank_precision(Config config, common::Precision precision) {
  config.compute.precision = precision;
  return config;
}

}  // namespace vtrain::config
