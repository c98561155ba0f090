// Helpers of the multi-rank tests (mpi_test, elastic_test, hosts_test): launching vtrain
// through mpirun as users do, LeNet training arguments that are bitwise
// reproducible, and comparing the weights that runs end with.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain::mpi_runs {

// A fresh temporary folder; dir / "name" is a path in it.
class TempDir {
 public:
  std::string operator/(const std::string& name) const { return dir_.path(name); }

 private:
  test_support::TempDir dir_;
};

using test_support::compare;
using test_support::Difference;
using test_support::mpirun;

// mpirun for several ranks, nothing for one (a plain process).
inline std::string launch(int ranks) { return ranks > 1 ? mpirun(ranks) : ""; }

inline int run(const std::string& command, std::string* output = nullptr) {
  return test_support::run_command(command, output);
}

inline const std::string kLeNetConfig = "configs/synthetic-lenet.yaml";
// For comparing weights across splits (see the file).
inline const std::string kSmoothLeNetConfig = "tests/configs/smooth-lenet.yaml";

// LeNet on small synthetic data, fixed algorithms (bitwise reproducible);
// `config` relative to the source tree.
inline std::string train_args(const std::string& ckpt_dir, int steps,
                              const std::string& extra = "",
                              const std::string& config = kLeNetConfig) {
  return test_support::vtrain_binary() + " " + test_support::source_dir() + "/" + config +
         " --progress off" +
         " --set train.batch=48 --set train.max_steps=" + std::to_string(steps) +
         " --set train.evaluate=false --set conv.algorithm=direct --set device.threads=1" +
         " --set checkpoint.dir=" + ckpt_dir + " " + extra;
}

// The parameters of the newest checkpoint in `dir`; empty if there is none.
inline std::vector<float> final_parameters(const std::string& dir) {
  const auto latest = worker::latest_checkpoint(dir);
  if (!latest) return {};
  return worker::load_checkpoint(*latest).parameters;
}

// The losses of the "step" records of a metrics file, as printed.
inline std::vector<std::string> logged_losses(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> losses;
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("\"loss\": ");
    if (line.find("\"event\": \"step\"") == std::string::npos || at == std::string::npos) continue;
    losses.push_back(line.substr(at + 8, line.find(',', at) - at - 8));
  }
  return losses;
}

}  // namespace vtrain::mpi_runs
