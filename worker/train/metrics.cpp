#include "worker/train/metrics.h"

#include "common/text.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "memory/chrome_trace.h"

namespace vtrain::worker {

JsonRecord& JsonRecord::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, common::json_quote(value));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, double value) {
  if (!std::isfinite(value)) {
    fields_.emplace_back(key, "null");  // JSON has no NaN or infinity
    return *this;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  fields_.emplace_back(key, buf);
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}

std::string JsonRecord::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += common::json_quote(fields_[i].first) + ": " + fields_[i].second;
  }
  return out + "}";
}

MetricsFile::MetricsFile(const std::string& path) : path_(path), out_(path, std::ios::trunc) {
  if (!out_) {
    throw std::runtime_error("cannot write metrics file " + path + ": " + std::strerror(errno));
  }
}

void MetricsFile::write(const JsonRecord& record) {
  if (!out_.is_open()) return;
  out_ << record.str() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("writing metrics file " + path_ + " failed");
}

Progress::Mode Progress::mode_for(ProgressSetting setting) {
  switch (setting) {
    case ProgressSetting::kLine: return Mode::kLines;
    case ProgressSetting::kOff: return Mode::kOff;
    case ProgressSetting::kAuto: break;
  }
  return isatty(fileno(stdout)) ? Mode::kLive : Mode::kLines;
}

void Progress::step(const std::string& line, bool log_point) {
  if (mode_ == Mode::kLive) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    std::fflush(out_);
    live_open_ = true;
  } else if (mode_ == Mode::kLines && log_point) {
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }
}

void Progress::line(const std::string& text) {
  if (mode_ == Mode::kOff) return;
  if (live_open_) {
    std::fputc('\n', out_);
    live_open_ = false;
  }
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

}  // namespace vtrain::worker
