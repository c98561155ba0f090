// Which algorithm each kernel of an unplanned conv layer runs: the
// candidates the backend offers (all of them for conv.algorithm auto, else
// the named one where offered), their tuned times, and the choice among
// them (tuning's fastest, or the dynamic memory policy's downgrade).
#pragma once

#include <array>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "worker/device/backend.h"

namespace vtrain::worker {

class ConvAlgorithmChoice {
 public:
  // Lists each kind's candidates for `problem`. `algorithm` is "auto" (all
  // candidates, the backend's first chosen until tune() measures) or a name
  // (the only candidate where the backend offers it, or a form of it,
  // "<name>/<variant>", for the problem's types; else the backend's first).
  // Throws std::runtime_error naming `layer` when a kind has none.
  ConvAlgorithmChoice(Backend& backend, const ConvProblem& problem, const std::string& algorithm,
                      const std::string& layer);

  // Drops the candidates that need more workspace than `bytes` (what the
  // device has room for), keeping at least each kind's smallest, and
  // re-chooses where the choice was dropped.
  void keep_within(size_t bytes);
  // Chooses each kind's candidate with the least workspace (the first on a
  // tie): the choice a memory plan's fit is decided on, as it depends on
  // sizes alone, never on timings.
  void choose_smallest();
  // Workspace that every candidate fits in (for tuning).
  size_t candidate_workspace() const;
  // Times each candidate of `kind` (when it has two or more) with
  // `run(algo)` and chooses the fastest; the first wins ties. A candidate
  // whose run throws BackendError (the backend offered it, then refused
  // the problem) is no candidate from then on (refused()); throws
  // BackendError naming the layer when none ran.
  void tune(Backend& backend, ConvKind kind, const std::function<void(ConvAlgo)>& run);
  // The algorithms tune() dropped, each "<kind> <name> (<the error>)".
  const std::vector<std::string>& refused() const { return refused_; }

  // The kind's candidates with their tuned seconds (0 where not timed).
  std::vector<std::pair<ConvAlgoInfo, double>> timed_candidates(ConvKind kind) const;
  // Chooses the candidate called `name`; throws BackendError naming the
  // layer when there is none.
  void choose(ConvKind kind, const std::string& name);
  const ConvAlgoInfo& chosen(ConvKind kind) const { return chosen_[static_cast<int>(kind)]; }
  // For a named algorithm: whether some kind offered it (or a form of it);
  // the names the kinds offered instead where none did (for the error a
  // network gives when no layer offers it).
  bool offers_named() const { return offers_named_; }
  const std::set<std::string>& offered_instead() const { return offered_instead_; }

 private:
  std::string layer_;
  std::array<std::vector<ConvAlgoInfo>, 3> candidates_;  // per kind
  std::array<ConvAlgoInfo, 3> chosen_;
  std::array<std::map<std::string, double>, 3> seconds_;  // tuned time per candidate
  std::vector<std::string> refused_;
  bool offers_named_ = false;
  std::set<std::string> offered_instead_;
};

// Why a named conv.algorithm runs nowhere: no choice of `choices` (the
// model's unplanned convolutions) offers it, with the names they offer
// instead; nothing for "auto", when one offers it, or without choices.
std::optional<std::string> named_algorithm_refusal(
    const std::string& algorithm, const std::vector<const ConvAlgorithmChoice*>& choices,
    const std::string& backend_name);

}  // namespace vtrain::worker
