#include "worker/train/metrics.h"

#include "common/text.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <cstring>

#include "memory/chrome_trace.h"

namespace vtrain::worker {
namespace {

// A double as JSON: 9 significant digits, null for NaN and infinity (JSON has none).
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  return buf;
}

// A JSON array of `values`, each encoded by `encode`.
template <typename T, typename Encode>
std::string json_array(std::span<const T> values, Encode encode) {
  std::string array = "[";
  for (const T& v : values) {
    if (array.size() > 1) array += ",";
    array += encode(v);
  }
  return array + "]";
}

}  // namespace

JsonRecord& JsonRecord::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, common::json_quote(value));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, double value) {
  fields_.emplace_back(key, json_number(value));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, std::span<const double> values) {
  fields_.emplace_back(key, json_array(values, json_number));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, std::span<const int64_t> values) {
  fields_.emplace_back(key, json_array(values, [](int64_t v) { return std::to_string(v); }));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, std::span<const std::string> values) {
  fields_.emplace_back(key, json_array(values, common::json_quote));
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, const JsonRecord& object) {
  fields_.emplace_back(key, object.str());
  return *this;
}

JsonRecord& JsonRecord::add(const std::string& key, std::span<const JsonRecord> objects) {
  fields_.emplace_back(key, json_array(objects, [](const JsonRecord& o) { return o.str(); }));
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

// O_APPEND: after a cut-off partial record, a later record would land at the
// new end, not past it.
MetricsFile::MetricsFile(const std::string& path, bool append)
    : path_(path),
      fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC),
                 0666)) {
  if (!fd_.valid()) {
    const int err = errno;
    throw common::OutputError("cannot write metrics file " + path + ": " + std::strerror(err));
  }
  // Appending: the records already there are whole ones to keep (a device
  // or FIFO has no end to seek to, and nothing to cut back).
  if (append) length_ = std::max<off_t>(::lseek(fd_.get(), 0, SEEK_END), 0);
}

void MetricsFile::write(const JsonRecord& record) {
  if (!fd_.valid()) return;
  const std::string line = record.str() + '\n';
  if (const int err = common::write_all(fd_.get(), line.data(), line.size())) {
    std::string message = "cannot write metrics file " + path_ + ": " + std::strerror(err);
    // A full disk takes part of the line: cut it off, so that the file ends
    // with the last whole record. A device or a FIFO has nothing to cut (EINVAL).
    const int cut = ::ftruncate(fd_.get(), length_) == 0 ? 0 : errno;
    if (cut != 0 && cut != EINVAL) {
      message += std::string(" (and the partial record is left: ") + std::strerror(cut) + ")";
    }
    throw common::OutputError(message);
  }
  length_ += static_cast<int64_t>(line.size());
}

Progress::Mode Progress::mode_for(ProgressSetting setting) {
  switch (setting) {
    case ProgressSetting::kLine: return Mode::kLines;
    case ProgressSetting::kOff: return Mode::kOff;
    case ProgressSetting::kAuto: break;
  }
  return auto_mode(isatty(fileno(stdout)) == 1,
                   [](const char* name) -> const char* { return std::getenv(name); });
}

Progress::Mode Progress::auto_mode(bool stdout_is_terminal,
                                   const char* (*getenv)(const char*)) {
  if (!stdout_is_terminal) return Mode::kLines;
  const char* const launcher_variables[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                            "SLURM_PROCID"};
  const bool launched = std::any_of(std::begin(launcher_variables), std::end(launcher_variables),
                                    [&](const char* name) { return getenv(name) != nullptr; });
  if (!launched) return Mode::kLive;
  const char* opt_in = getenv("VTRAIN_PROGRESS");
  return opt_in != nullptr && std::string(opt_in) == "live" ? Mode::kLive : Mode::kLines;
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
  if (mode_ == Mode::kSilent) return;
  if (live_open_) {
    std::fputc('\n', out_);
    live_open_ = false;
  }
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

}  // namespace vtrain::worker
