#include "worker/engine/layers/conv_algorithm_choice.h"

#include <algorithm>
#include <stdexcept>

#include "common/text.h"
#include "worker/engine/conv_kernel.h"
#include "worker/engine/kernel_timing.h"

namespace vtrain::worker {
namespace {

// The candidate with the least workspace, the first on a tie.
const ConvAlgoInfo& least_workspace(const std::vector<ConvAlgoInfo>& options) {
  return *std::min_element(options.begin(), options.end(), [](const auto& a, const auto& b) {
    return a.workspace_bytes < b.workspace_bytes;
  });
}

}  // namespace

ConvAlgorithmChoice::ConvAlgorithmChoice(Backend& backend, const ConvProblem& problem,
                                         const std::string& algorithm, const std::string& layer)
    : layer_(layer) {
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    auto& options = candidates_[static_cast<int>(kind)];
    options = conv_algorithms(backend, kind, problem, adds_to_shared_input_gradient(kind));
    if (options.empty()) {
      throw std::runtime_error("layer '" + layer + "': no " + conv_kind_name(kind) +
                               " convolution algorithm for " + problem.str());
    }
    // A named algorithm applies where the backend offers it, else in the
    // first form of it the backend offers for this problem's types,
    // "<name>/<variant>" (the CPU's winograd/pseudo_bf16 for winograd in
    // bf16, cuDNN's algo_1/pseudo_half in fp16); elsewhere, and for "auto"
    // until tune() has measured, the backend's first one.
    auto it = std::find_if(options.begin(), options.end(),
                           [&](const ConvAlgoInfo& a) { return a.name == algorithm; });
    if (it == options.end()) {
      it = std::find_if(options.begin(), options.end(), [&](const ConvAlgoInfo& a) {
        return a.name.starts_with(algorithm + "/");
      });
    }
    chosen_[static_cast<int>(kind)] = it != options.end() ? *it : options.front();
    if (algorithm == "auto") continue;
    if (it != options.end()) {
      offers_named_ = true;
    } else {
      for (const ConvAlgoInfo& a : options) offered_instead_.insert(a.name);
    }
    options = {chosen_[static_cast<int>(kind)]};
  }
}

void ConvAlgorithmChoice::keep_within(size_t bytes) {
  for (int k = 0; k < 3; ++k) {
    auto& options = candidates_[k];
    if (options.empty()) continue;
    const ConvAlgoInfo smallest = least_workspace(options);
    std::erase_if(options, [&](const ConvAlgoInfo& a) { return a.workspace_bytes > bytes; });
    if (options.empty()) options.push_back(smallest);
    if (std::none_of(options.begin(), options.end(),
                     [&](const ConvAlgoInfo& a) { return a.algo == chosen_[k].algo; })) {
      chosen_[k] = options.front();
    }
  }
}

void ConvAlgorithmChoice::choose_smallest() {
  for (int k = 0; k < 3; ++k) {
    const auto& options = candidates_[k];
    if (options.empty()) continue;
    chosen_[k] = least_workspace(options);
  }
}

size_t ConvAlgorithmChoice::candidate_workspace() const {
  size_t bytes = 0;
  for (const auto& options : candidates_) {
    for (const ConvAlgoInfo& a : options) bytes = std::max(bytes, a.workspace_bytes);
  }
  return bytes;
}

void ConvAlgorithmChoice::tune(Backend& backend, ConvKind kind,
                               const std::function<void(ConvAlgo)>& run) {
  const int k = static_cast<int>(kind);
  auto& options = candidates_[k];
  if (options.size() < 2) return;
  // One warm-up run (creates the primitive, warms caches), then the
  // fastest of two: noise only ever adds time.
  const std::vector<AlgorithmTime> times =
      time_algorithms(backend, options, {1, 2, TimingStatistic::kMin}, run);
  std::vector<ConvAlgoInfo> ran;
  const AlgorithmTime* best = nullptr;
  for (const AlgorithmTime& t : times) {
    if (!t.time) continue;
    seconds_[k][t.algo.name] = t.time->seconds;
    ran.push_back(t.algo);
    if (best == nullptr || t.time->seconds < best->time->seconds) best = &t;
  }
  const std::vector<std::string> refused = refusals(times);
  if (best == nullptr) {
    throw BackendError("layer '" + layer_ + "': no " + conv_kind_name(kind) +
                       " algorithm ran: " + common::join(refused, "; "));
  }
  for (const std::string& r : refused) refused_.push_back(std::string(conv_kind_name(kind)) + " " + r);
  options = std::move(ran);  // what refused is no candidate
  chosen_[k] = best->algo;
}

std::vector<std::pair<ConvAlgoInfo, double>> ConvAlgorithmChoice::timed_candidates(
    ConvKind kind) const {
  std::vector<std::pair<ConvAlgoInfo, double>> out;
  const auto& seconds = seconds_[static_cast<int>(kind)];
  for (const ConvAlgoInfo& a : candidates_[static_cast<int>(kind)]) {
    auto it = seconds.find(a.name);
    out.push_back({a, it == seconds.end() ? 0.0 : it->second});
  }
  return out;
}

void ConvAlgorithmChoice::choose(ConvKind kind, const std::string& name) {
  for (const ConvAlgoInfo& a : candidates_[static_cast<int>(kind)]) {
    if (a.name == name) {
      chosen_[static_cast<int>(kind)] = a;
      return;
    }
  }
  throw BackendError("layer '" + layer_ + "': no " + conv_kind_name(kind) +
                     " candidate named '" + name + "'");
}

std::optional<std::string> named_algorithm_refusal(
    const std::string& algorithm, const std::vector<const ConvAlgorithmChoice*>& choices,
    const std::string& backend_name) {
  if (algorithm == "auto") return std::nullopt;
  std::set<std::string> instead;
  for (const ConvAlgorithmChoice* c : choices) {
    if (c->offers_named()) return std::nullopt;
    instead.insert(c->offered_instead().begin(), c->offered_instead().end());
  }
  if (instead.empty()) return std::nullopt;  // no convolution chooses an algorithm
  return "conv.algorithm '" + algorithm + "': no convolution of the model offers an algorithm " +
         "of that name on the " + backend_name + " backend (its convolutions offer: " +
         common::join({instead.begin(), instead.end()}, ", ") + "; or auto)";
}

}  // namespace vtrain::worker
