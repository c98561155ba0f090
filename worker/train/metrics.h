// Progress output and the JSON-lines metrics file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/files.h"
#include "common/name_table.h"

namespace vtrain::worker {

// One JSON object: keys in insertion order, numbers or strings.
class JsonRecord {
 public:
  JsonRecord& add(const std::string& key, const std::string& value);
  JsonRecord& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonRecord& add(const std::string& key, double value);
  JsonRecord& add(const std::string& key, int64_t value);
  JsonRecord& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonRecord& add(const std::string& key, std::span<const double> values);  // a JSON array
  JsonRecord& add(const std::string& key, std::span<const int64_t> values);  // a JSON array
  JsonRecord& add(const std::string& key, std::span<const std::string> values);  // a JSON array
  JsonRecord& add(const std::string& key, const JsonRecord& object);  // a nested object
  JsonRecord& add(const std::string& key, std::span<const JsonRecord> objects);  // an array of them
  std::string str() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;  // value already JSON-encoded
};

// Appends records to a JSON-lines file, each line in one write(), so a
// reader (or a crash) never sees half a record.
class MetricsFile {
 public:
  MetricsFile() = default;
  // Creates or truncates `path`, or appends to it with `append` (as a
  // resumed run does); a device or FIFO is written in place. Throws
  // common::OutputError naming it and the reason.
  explicit MetricsFile(const std::string& path, bool append = false);
  bool enabled() const { return fd_.valid(); }
  // Throws common::OutputError naming the file and the reason (a full disk);
  // a line cut short is removed, so the file still ends with a whole record.
  void write(const JsonRecord& record);

 private:
  std::string path_;
  common::Fd fd_;
  int64_t length_ = 0;  // bytes of whole records written
};

// Step progress: a live line rewritten in place on a terminal, or plain log
// lines every `every` steps otherwise.
// output.progress in the config.
enum class ProgressSetting {
  kAuto,  // a live line on a terminal, log lines otherwise
  kLine,  // log lines
  kOff,
};
inline constexpr auto kProgressSettingNames = std::to_array<common::Named<ProgressSetting>>(
    {{ProgressSetting::kAuto, "auto"}, {ProgressSetting::kLine, "line"},
     {ProgressSetting::kOff, "off"}});
inline const char* progress_setting_name(ProgressSetting setting) {
  return common::name_of(kProgressSettingNames, setting);
}

class Progress {
 public:
  // kOff (output.progress off) leaves out the step lines only: line()s are
  // the run's log (setup, epochs, checkpoints, resume) and still print.
  // kSilent prints nothing (the ranks other than 0).
  enum class Mode { kLive, kLines, kOff, kSilent };
  // kAuto: auto_mode() for this process's stdout and environment.
  static Mode mode_for(ProgressSetting setting);
  // What "auto" means. Outside a launcher: kLive when stdout is a terminal.
  // A rank started by mpirun or srun (OMPI_COMM_WORLD_SIZE, PMIX_RANK,
  // PMI_RANK or SLURM_PROCID is set) may have a pty of its own (Open MPI
  // gives ranks one) while the launcher's output goes to a file, so there
  // it is kLines unless VTRAIN_PROGRESS=live says the launcher's own output
  // is a terminal (scripts/mpirun.sh sets that when it is). `getenv` is
  // passed in so that tests need not change the environment.
  static Mode auto_mode(bool stdout_is_terminal, const char* (*getenv)(const char*));
  explicit Progress(Mode mode, FILE* out = stdout) : mode_(mode), out_(out) {}
  // A step line ("epoch 1/10 step 120/937 loss 0.512 acc 0.83 1234 img/s").
  void step(const std::string& line, bool log_point);
  // A line that must stay on screen (epoch summaries); ends a live line first.
  void line(const std::string& text);

 private:
  Mode mode_;
  FILE* out_;
  bool live_open_ = false;
};

}  // namespace vtrain::worker
