// A timeline in the Chrome trace event format (JSON), for chrome://tracing
// or https://ui.perfetto.dev: spans on named tracks (the compute stream, the
// memory stream), instant events (a release), and counters (device bytes in
// use). One process per rank: every event carries the rank as its pid, and
// the events of several ranks concatenate into one file (merge_chrome_traces).
//
// Thread-safe: the memory stream may add events from its own thread.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace vtrain::memory {

class ChromeTrace {
 public:
  // `pid`: the rank; `process_name` labels it ("rank 0 (cpu)").
  ChromeTrace(int pid, std::string process_name);

  // Microseconds since construction: the clock of every event.
  double now_us() const;
  // A complete span [start_us, start_us + duration_us) on `track`.
  void span(std::string_view track, std::string_view name, std::string_view category,
            double start_us, double duration_us, std::string_view detail = {});
  void instant(std::string_view track, std::string_view name, std::string_view category,
               double at_us);
  // A counter track `name` taking `value` from `at_us` on.
  void counter(std::string_view name, double at_us, double value);

  size_t event_count() const;
  // The events as JSON objects joined by commas (no brackets), with the
  // process and track names first.
  std::string events_json() const;
  // {"traceEvents": [...], "displayTimeUnit": "ms"}
  std::string json() const;
  // Throws common::OutputError naming the path when it cannot be written.
  void write(const std::string& path) const;

 private:
  int tid(std::string_view track);  // caller holds mutex_

  int pid_;
  std::string process_name_;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mutex_;
  std::map<std::string, int, std::less<>> tracks_;
  std::vector<std::string> events_;
};

// One trace file from the events_json() of several ranks.
std::string merge_chrome_traces(const std::vector<std::string>& events_json);

// Writes a trace's JSON to `path` whole or not at all (common::OutputFile):
// a failed write leaves no empty or partial trace. Throws common::OutputError.
void write_trace_file(const std::string& path, const std::string& json);

}  // namespace vtrain::memory
