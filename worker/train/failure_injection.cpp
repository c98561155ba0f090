#include "worker/train/failure_injection.h"

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace vtrain::worker {
namespace {

// The value of `name` as an integer >= 0, or nullopt where it is unset.
std::optional<int64_t> env_count(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  const std::string_view s(text);
  int64_t value = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0) {
    throw std::invalid_argument(std::string(name) + ": expected an integer >= 0, got '" + text + "'");
  }
  return value;
}

}  // namespace

std::optional<FailureInjection> FailureInjection::from_environment(int rank) {
  const std::optional<int64_t> step = env_count("VTRAIN_FAIL_AT_STEP");
  const std::optional<int64_t> only = env_count("VTRAIN_FAIL_RANK");
  Where where = Where::kStepStart;
  if (const char* in = std::getenv("VTRAIN_FAIL_IN")) {
    const std::string_view s(in);
    if (s == "backward") {
      where = Where::kBackward;
    } else if (!s.empty() && s != "start") {
      throw std::invalid_argument(std::string("VTRAIN_FAIL_IN: expected 'start' or 'backward', got '") +
                                  in + "'");
    }
  }
  if (!step || (only && *only != rank)) return std::nullopt;
  return FailureInjection(*step, where);
}

void FailureInjection::on_step_start(const StepEvent& step) {
  // Backward launches no allreduce here: fail at the start instead, so the
  // failure still happens.
  if (step.step != step_ || (where_ == Where::kBackward && step.allreduce_in_backward)) return;
  throw std::runtime_error("injected failure at step " + std::to_string(step.step) +
                           " (VTRAIN_FAIL_AT_STEP)");
}

void FailureInjection::on_bucket_launched(const StepEvent& step) {
  if (step.step != step_ || where_ != Where::kBackward) return;
  throw std::runtime_error("injected failure in backward at step " + std::to_string(step.step) +
                           " (VTRAIN_FAIL_AT_STEP, VTRAIN_FAIL_IN=backward)");
}

std::optional<SlowdownInjection> SlowdownInjection::from_environment(int rank) {
  const std::optional<int64_t> step = env_count("VTRAIN_SLOW_AT_STEP");
  const std::optional<int64_t> until = env_count("VTRAIN_SLOW_UNTIL_STEP");
  const std::optional<int64_t> only = env_count("VTRAIN_SLOW_RANK");
  double factor = 2;
  if (const char* text = std::getenv("VTRAIN_SLOW_FACTOR")) {
    char* end = nullptr;
    factor = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(factor >= 1) || factor > 1e3) {
      throw std::invalid_argument(std::string("VTRAIN_SLOW_FACTOR: expected a number from 1 to "
                                              "1000, got '") + text + "'");
    }
  }
  if (!step || (only && *only != rank)) return std::nullopt;
  return SlowdownInjection(*step, until.value_or(INT64_MAX), factor);
}

void SlowdownInjection::on_compute_done(const StepEvent& step, double seconds) {
  if (step.step < from_step_ || step.step >= until_step_) return;
  std::this_thread::sleep_for(std::chrono::duration<double>((factor_ - 1) * seconds));
}

void SlowdownInjection::on_probe_done(const StepEvent& step, double seconds) {
  on_compute_done(step, seconds);
}

}  // namespace vtrain::worker
