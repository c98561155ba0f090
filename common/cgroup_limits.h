// What this process's control groups allow it: the CPU bandwidth of a CFS
// quota (a container's CPU limit: `docker run --cpus`, a Kubernetes limit,
// systemd's CPUQuota=) and a memory limit. On a machine shared this way a
// CPU "device" is the slice it gets, not the whole chip: the CPU backend
// names the quota in its device identity (so the perf DB keeps a throttled
// slice's timings apart), runs no more threads than the quota can keep
// busy, and serves no more memory than the limit.
//
// Both cgroup versions are read (v1's cpu and memory controllers, v2's
// unified hierarchy), each limit as the least over the process's cgroup and
// its ancestors up to the hierarchy's mount. Anything unreadable counts as
// no limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vtrain::common {

// The CPUs' worth of time per second the process may use (0.5: half a
// CPU), or nullopt when no quota limits it.
std::optional<double> cpu_quota();

// The bytes the process's memory cgroup allows, or nullopt when unlimited.
std::optional<uint64_t> cgroup_memory_limit();

// ------------------------------------------------ the parts, for tests

// The directories of controller `controller` ("cpu", "memory") that hold
// this process's limits, its own cgroup first, then each ancestor up to
// the hierarchy's mount point. From the text of /proc/self/mountinfo and
// /proc/self/cgroup: a v1 hierarchy that carries the controller wins, else
// the v2 hierarchy. Empty when neither is mounted.
std::vector<std::string> cgroup_dirs(std::string_view controller, std::string_view mountinfo,
                                     std::string_view proc_cgroup);

// v2's cpu.max ("max 100000", "50000 100000") in CPUs (0.5); nullopt for
// "max" or text that is not a quota.
std::optional<double> parse_cpu_max(std::string_view text);
// v1's cpu.cfs_quota_us and cpu.cfs_period_us in CPUs; nullopt for a
// quota of -1 (none) or values that are not a quota.
std::optional<double> parse_cfs_quota(std::string_view quota_us, std::string_view period_us);
// v2's memory.max or v1's memory.limit_in_bytes; nullopt for "max" or
// v1's "no limit" (a value at or above 2^62).
std::optional<uint64_t> parse_memory_limit(std::string_view text);

// "0.5", "1.5", "2": a quota as the device identity names it.
std::string format_cpus(double cpus);

}  // namespace vtrain::common
