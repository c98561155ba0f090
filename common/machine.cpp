#include "common/machine.h"

#include "common/cgroup_limits.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <thread>

namespace vtrain::common {

int hardware_threads() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

uint64_t usable_memory_bytes() {
  const uint64_t physical = physical_memory_bytes();
  const std::optional<uint64_t> limit = cgroup_memory_limit();
  if (!limit) return physical;
  return physical == 0 ? *limit : std::min(physical, *limit);
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

}  // namespace vtrain::common
