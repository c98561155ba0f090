#include "memory/chrome_trace.h"

#include "common/files.h"
#include "common/text.h"

#include <cstdio>

namespace vtrain::memory {


namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

ChromeTrace::ChromeTrace(int pid, std::string process_name)
    : pid_(pid), process_name_(std::move(process_name)), start_(std::chrono::steady_clock::now()) {}

double ChromeTrace::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
      .count();
}

int ChromeTrace::tid(std::string_view track) {
  auto it = tracks_.find(track);
  if (it != tracks_.end()) return it->second;
  const int id = static_cast<int>(tracks_.size()) + 1;
  tracks_.emplace(std::string(track), id);
  return id;
}

void ChromeTrace::span(std::string_view track, std::string_view name, std::string_view category,
                       double start_us, double duration_us, std::string_view detail) {
  std::lock_guard lock(mutex_);
  std::string e = "{\"ph\":\"X\",\"pid\":" + std::to_string(pid_) +
                  ",\"tid\":" + std::to_string(tid(track)) + ",\"name\":" + common::json_quote(name) +
                  ",\"cat\":" + common::json_quote(category) + ",\"ts\":" + number(start_us) +
                  ",\"dur\":" + number(duration_us);
  if (!detail.empty()) e += ",\"args\":{\"detail\":" + common::json_quote(detail) + "}";
  events_.push_back(e + "}");
}

void ChromeTrace::instant(std::string_view track, std::string_view name,
                          std::string_view category, double at_us) {
  std::lock_guard lock(mutex_);
  events_.push_back("{\"ph\":\"i\",\"s\":\"t\",\"pid\":" + std::to_string(pid_) +
                    ",\"tid\":" + std::to_string(tid(track)) + ",\"name\":" + common::json_quote(name) +
                    ",\"cat\":" + common::json_quote(category) + ",\"ts\":" + number(at_us) + "}");
}

void ChromeTrace::counter(std::string_view name, double at_us, double value) {
  std::lock_guard lock(mutex_);
  events_.push_back("{\"ph\":\"C\",\"pid\":" + std::to_string(pid_) +
                    ",\"name\":" + common::json_quote(name) + ",\"ts\":" + number(at_us) +
                    ",\"args\":{\"bytes\":" + number(value) + "}}");
}

size_t ChromeTrace::event_count() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::string ChromeTrace::events_json() const {
  std::lock_guard lock(mutex_);
  std::string out = "{\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
                    ",\"name\":\"process_name\",\"args\":{\"name\":" + common::json_quote(process_name_) +
                    "}}";
  for (const auto& [track, id] : tracks_) {
    out += ",\n{\"ph\":\"M\",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(id) +
           ",\"name\":\"thread_name\",\"args\":{\"name\":" + common::json_quote(track) + "}}";
  }
  for (const std::string& e : events_) out += ",\n" + e;
  return out;
}

std::string merge_chrome_traces(const std::vector<std::string>& events_json) {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  for (const std::string& part : events_json) {
    if (part.empty()) continue;
    if (!first) out += ",\n";
    out += part;
    first = false;
  }
  return out + "\n],\"displayTimeUnit\":\"ms\"}\n";
}

std::string ChromeTrace::json() const { return merge_chrome_traces({events_json()}); }

void ChromeTrace::write(const std::string& path) const { write_trace_file(path, json()); }

void write_trace_file(const std::string& path, const std::string& json) {
  common::write_file_whole(path, json, "trace");
}

}  // namespace vtrain::memory
