// The records of a metrics file (output.metrics / --metrics, docs/metrics.md)
// as JSON objects, for tests that read what a run reported.
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace vtrain::test_support {

// The records of the metrics file at `path` whose "event" is `event`
// ("step", "epoch", "rebalance", "end"), in the order written.
inline std::vector<nlohmann::json> metric_records(const std::string& path,
                                                  const std::string& event) {
  std::vector<nlohmann::json> records;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record["event"] == event) records.push_back(std::move(record));
  }
  return records;
}

// One field of each of those records, as a number.
inline std::vector<double> metric_values(const std::string& path, const std::string& event,
                                         const std::string& key) {
  std::vector<double> values;
  for (const nlohmann::json& record : metric_records(path, event)) {
    if (record.contains(key)) values.push_back(record[key].get<double>());
  }
  return values;
}

}  // namespace vtrain::test_support
