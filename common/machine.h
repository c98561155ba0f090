// What the host offers, asked of the OS: hardware threads and physical
// memory (less a memory cgroup's limit). The CPU backend sizes itself by these, and the config checks
// (configs/config_limits.h) refuse what would not fit them.
#pragma once

#include <cstdint>
#include <string>

namespace vtrain::common {

// Hardware threads of the machine (std::thread::hardware_concurrency); at
// least 1, also when the OS does not say.
int hardware_threads();

// Physical memory in bytes; 0 when the OS does not say.
uint64_t physical_memory_bytes();

// The memory this process may use: physical memory, or its memory cgroup's
// limit where that is lower (common/cgroup_limits.h); 0 when unknown.
uint64_t usable_memory_bytes();

// The CPU's model name (/proc/cpuinfo's "model name"), what the CPU
// backend names its device by; "unknown CPU" when the OS does not say.
std::string cpu_model_name();

}  // namespace vtrain::common
