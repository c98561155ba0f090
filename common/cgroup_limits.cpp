#include "common/cgroup_limits.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace vtrain::common {

namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(sep, start), text.size());
    parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(" \t\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\n") - first + 1);
}

std::optional<int64_t> parse_int(std::string_view s) {
  s = trim(s);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

bool contains(const std::vector<std::string_view>& items, std::string_view item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A mount of a cgroup hierarchy: where it is, and which cgroup its root is.
struct Mount {
  std::string point;
  std::string root;
};

// The mount of the v1 hierarchy carrying `controller` (v2 = false), or of
// the v2 hierarchy (v2 = true), from /proc/self/mountinfo: "id parent
// major:minor root point options [optional...] - fstype source super".
std::optional<Mount> find_mount(std::string_view controller, bool v2, std::string_view mountinfo) {
  for (std::string_view line : split(mountinfo, '\n')) {
    const std::vector<std::string_view> fields = split(trim(line), ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string_view type = dash[1];
    const bool match =
        v2 ? type == "cgroup2" : type == "cgroup" && contains(split(dash[3], ','), controller);
    if (match) return Mount{std::string(fields[4]), std::string(fields[3])};
  }
  return std::nullopt;
}

// The process's cgroup path in the hierarchy of `controller` (v1) or the
// unified one (v2), from /proc/self/cgroup: "id:controllers:path".
std::optional<std::string> find_path(std::string_view controller, bool v2,
                                     std::string_view proc_cgroup) {
  for (std::string_view line : split(proc_cgroup, '\n')) {
    line = trim(line);
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, first);
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const bool match =
        v2 ? id == "0" && controllers.empty() : contains(split(controllers, ','), controller);
    if (match) return std::string(line.substr(second + 1));
  }
  return std::nullopt;
}

std::vector<std::string> dirs_of(const Mount& mount, std::string path) {
  // A path under the mount's root is relative to it; in a cgroup namespace
  // the root is "/" and the path is already relative.
  if (mount.root != "/" && path.rfind(mount.root, 0) == 0) path = path.substr(mount.root.size());
  std::vector<std::string> dirs;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    dirs.push_back(path == "/" || path.empty() ? mount.point : mount.point + path);
    if (path == "/" || path.empty()) break;
    path = path.substr(0, path.rfind('/'));
  }
  return dirs;
}

// cgroup_dirs, and whether they are v2's.
struct Dirs {
  std::vector<std::string> dirs;
  bool v2 = false;
};

Dirs find_dirs(std::string_view controller, std::string_view mountinfo,
               std::string_view proc_cgroup) {
  for (const bool v2 : {false, true}) {
    const std::optional<Mount> mount = find_mount(controller, v2, mountinfo);
    const std::optional<std::string> path = find_path(controller, v2, proc_cgroup);
    if (mount && path) return {dirs_of(*mount, *path), v2};
  }
  return {};
}

Dirs own_dirs(std::string_view controller) {
  return find_dirs(controller, read_whole("/proc/self/mountinfo"), read_whole("/proc/self/cgroup"));
}

template <typename T>
std::optional<T> least(std::optional<T> a, std::optional<T> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

}  // namespace

std::vector<std::string> cgroup_dirs(std::string_view controller, std::string_view mountinfo,
                                     std::string_view proc_cgroup) {
  return find_dirs(controller, mountinfo, proc_cgroup).dirs;
}

std::optional<double> parse_cpu_max(std::string_view text) {
  const std::vector<std::string_view> fields = split(trim(text), ' ');
  if (fields.size() != 2) return std::nullopt;
  return parse_cfs_quota(fields[0], fields[1]);
}

std::optional<double> parse_cfs_quota(std::string_view quota_us, std::string_view period_us) {
  const std::optional<int64_t> quota = parse_int(quota_us);
  const std::optional<int64_t> period = parse_int(period_us);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<uint64_t> parse_memory_limit(std::string_view text) {
  const std::optional<int64_t> bytes = parse_int(text);
  if (!bytes || *bytes <= 0 || *bytes >= (int64_t{1} << 62)) return std::nullopt;
  return static_cast<uint64_t>(*bytes);
}

std::string format_cpus(double cpus) {
  std::ostringstream out;
  out.precision(3);
  out << cpus;
  return out.str();
}

std::optional<double> cpu_quota() {
  const Dirs found = own_dirs("cpu");
  std::optional<double> quota;
  for (const std::string& dir : found.dirs) {
    quota = least(quota, found.v2 ? parse_cpu_max(read_whole(dir + "/cpu.max"))
                            : parse_cfs_quota(read_whole(dir + "/cpu.cfs_quota_us"),
                                              read_whole(dir + "/cpu.cfs_period_us")));
  }
  return quota;
}

std::optional<uint64_t> cgroup_memory_limit() {
  const Dirs found = own_dirs("memory");
  std::optional<uint64_t> limit;
  for (const std::string& dir : found.dirs) {
    limit = least(limit, parse_memory_limit(
                             read_whole(dir + (found.v2 ? "/memory.max" : "/memory.limit_in_bytes"))));
  }
  return limit;
}

}  // namespace vtrain::common
