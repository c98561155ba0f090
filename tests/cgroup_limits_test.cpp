// A CPU device's slice of the machine from its control groups
// (common/cgroup_limits.h): the parsers against known texts, and, where this
// machine lets a test make cgroups (as root with a writable cgroup
// filesystem), `vtrain check` run inside one with a CPU quota and a memory
// limit, as a container would start it.
#include "common/cgroup_limits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/machine.h"
#include "common/text.h"
#include "tests/test_support.h"

namespace vtrain {
namespace {

using common::cgroup_dirs;
using Dirs = std::vector<std::string>;
using test_support::run_command;
using test_support::run_vtrain;
using test_support::RunResult;
using test_support::source_dir;
using test_support::vtrain_binary;

// This machine's kind of layout: v1 controllers each mounted apart, and an
// empty v2 hierarchy beside them (a hybrid host).
constexpr const char* kHybridMounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(CgroupDirs, AV1ControllerGivesItsCgroupThenEachAncestorUpToTheMount) {
  const char* cgroups = "4:memory:/jobs/a\n2:cpuacct:/\n1:cpu:/jobs/a/rank1\n0::/\n";
  EXPECT_EQ(cgroup_dirs("cpu", kHybridMounts, cgroups),
            (Dirs{"/sys/fs/cgroup/cpu/jobs/a/rank1", "/sys/fs/cgroup/cpu/jobs/a",
                  "/sys/fs/cgroup/cpu/jobs", "/sys/fs/cgroup/cpu"}));
  EXPECT_EQ(cgroup_dirs("memory", kHybridMounts, cgroups),
            (Dirs{"/sys/fs/cgroup/memory/jobs/a", "/sys/fs/cgroup/memory/jobs",
                  "/sys/fs/cgroup/memory"}));
  // The root cgroup is the mount itself.
  EXPECT_EQ(cgroup_dirs("cpu", kHybridMounts, "1:cpu:/\n"), (Dirs{"/sys/fs/cgroup/cpu"}));
}

TEST(CgroupDirs, ControllersAreMatchedAsWholeNamesInCombinedHierarchies) {
  const char* mounts =
      "25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
  EXPECT_EQ(cgroup_dirs("cpu", mounts, "3:cpu,cpuacct:/docker/f00\n"),
            (Dirs{"/sys/fs/cgroup/cpu,cpuacct/docker/f00", "/sys/fs/cgroup/cpu,cpuacct/docker",
                  "/sys/fs/cgroup/cpu,cpuacct"}));
  // "cpuacct" is not "cpu": with only it mounted there is no cpu hierarchy.
  EXPECT_EQ(cgroup_dirs("cpu", "33 31 0:30 / /a rw - cgroup cgroup rw,cpuacct\n",
                        "2:cpuacct:/x\n"),
            Dirs{});
}

TEST(CgroupDirs, AMountOfASubtreeStripsItsRootFromThePath) {
  // A container's view: its own cgroup bind-mounted as the hierarchy.
  const char* mounts =
      "600 590 0:29 /kubepods/pod1/c1 /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n";
  EXPECT_EQ(cgroup_dirs("cpu", mounts, "5:cpu:/kubepods/pod1/c1/worker\n"),
            (Dirs{"/sys/fs/cgroup/cpu/worker", "/sys/fs/cgroup/cpu"}));
}

TEST(CgroupDirs, TheUnifiedHierarchyServesControllersNoV1HierarchyCarries) {
  const char* v2_only = "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
  const char* cgroups = "0::/user.slice/job.scope\n";
  const Dirs expected{"/sys/fs/cgroup/user.slice/job.scope", "/sys/fs/cgroup/user.slice",
                      "/sys/fs/cgroup"};
  EXPECT_EQ(cgroup_dirs("cpu", v2_only, cgroups), expected);
  EXPECT_EQ(cgroup_dirs("memory", v2_only, cgroups), expected);
  // On the hybrid host, a controller with no v1 hierarchy falls to v2.
  EXPECT_EQ(cgroup_dirs("io", kHybridMounts, "1:cpu:/\n0::/a\n"),
            (Dirs{"/sys/fs/cgroup/unified/a", "/sys/fs/cgroup/unified"}));
  EXPECT_EQ(cgroup_dirs("cpu", "", ""), Dirs{});
}

TEST(CgroupLimits, QuotasAndLimitsParseAsTheKernelWritesThem) {
  EXPECT_EQ(common::parse_cpu_max("50000 100000\n"), 0.5);
  EXPECT_EQ(common::parse_cpu_max("250000 100000"), 2.5);
  EXPECT_FALSE(common::parse_cpu_max("max 100000\n"));
  EXPECT_FALSE(common::parse_cpu_max(""));
  EXPECT_FALSE(common::parse_cpu_max("50000"));
  EXPECT_EQ(common::parse_cfs_quota("2000\n", "5000\n"), 0.4);
  EXPECT_FALSE(common::parse_cfs_quota("-1\n", "100000\n"));
  EXPECT_FALSE(common::parse_cfs_quota("", ""));
  EXPECT_EQ(common::parse_memory_limit("1073741824\n"), uint64_t{1} << 30);
  EXPECT_FALSE(common::parse_memory_limit("max\n"));
  EXPECT_FALSE(common::parse_memory_limit("9223372036854771712\n"));  // v1's "no limit"
  EXPECT_EQ(common::format_cpus(0.4), "0.4");
  EXPECT_EQ(common::format_cpus(1.5), "1.5");
  EXPECT_EQ(common::format_cpus(2), "2");
  EXPECT_EQ(common::format_cpus(1.0 / 3), "0.333");
}

// ------------------------------------------------------------ on this host

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return static_cast<bool>(out);
}

// A cgroup made for the test under the mount of `controller`'s hierarchy
// (a parent and a child in it), removed when it goes.
class TestCgroup {
 public:
  explicit TestCgroup(const std::string& controller) {
    const Dirs dirs = cgroup_dirs(controller, read_text("/proc/self/mountinfo"),
                                  read_text("/proc/self/cgroup"));
    if (dirs.empty()) {
      why_not_ = "no " + controller + " cgroup hierarchy is mounted";
      return;
    }
    const std::string mount = dirs.back();
    v2_ = std::filesystem::exists(mount + "/cgroup.controllers");
    if (v2_ && !write_text(mount + "/cgroup.subtree_control", "+" + controller)) {
      why_not_ = "cannot enable the " + controller + " controller in " + mount;
      return;
    }
    parent_ = mount + "/vtrain-test-" + std::to_string(getpid());
    std::error_code error;
    if (!std::filesystem::create_directory(parent_, error)) {
      why_not_ = "cannot make a cgroup in " + mount + " (" + error.message() + ")";
      parent_.clear();
      return;
    }
    if (v2_ && !write_text(parent_ + "/cgroup.subtree_control", "+" + controller)) {
      why_not_ = "cannot enable the " + controller + " controller in " + parent_;
      return;
    }
    if (!std::filesystem::create_directory(child(), error)) {
      why_not_ = "cannot make a cgroup in " + parent_ + " (" + error.message() + ")";
    }
  }
  ~TestCgroup() {
    if (parent_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove(child(), ignored);  // rmdir: empty once its processes exit
    std::filesystem::remove(parent_, ignored);
  }
  TestCgroup(const TestCgroup&) = delete;
  TestCgroup& operator=(const TestCgroup&) = delete;

  const std::string& why_not() const { return why_not_; }  // "" when made
  bool v2() const { return v2_; }
  const std::string& parent() const { return parent_; }
  std::string child() const { return parent_ + "/rank"; }

 private:
  std::string parent_;
  std::string why_not_;
  bool v2_ = false;
};

// The exit code of a shell that could not move itself into the cgroup.
constexpr int kCannotMove = 77;

// `vtrain check` started in `cgroup` (as a container runtime would start
// it); exit code kCannotMove where the host does not let a process move in.
RunResult check_in(const std::string& cgroup) {
  RunResult r;
  r.exit_code = run_command("sh -c 'echo $$ > " + cgroup + "/cgroup.procs || exit " +
                                std::to_string(kCannotMove) + "; exec " + vtrain_binary() +
                                " check " + source_dir() + "/configs/synthetic-lenet.yaml'",
                            &r.output);
  return r;
}

TEST(CgroupLimitsOnThisHost, AQuotaOnAnAncestorNamesTheDeviceAndSetsItsThreads) {
  TestCgroup cgroup("cpu");
  if (!cgroup.why_not().empty()) GTEST_SKIP() << cgroup.why_not();
  // Half a CPU on the parent; the process runs in its unlimited child.
  const bool set = cgroup.v2()
                       ? write_text(cgroup.parent() + "/cpu.max", "5000 10000")
                       : write_text(cgroup.parent() + "/cpu.cfs_period_us", "10000") &&
                             write_text(cgroup.parent() + "/cpu.cfs_quota_us", "5000");
  if (!set) GTEST_SKIP() << "cannot set a CPU quota on " << cgroup.parent();

  const RunResult r = check_in(cgroup.child());
  if (r.exit_code == kCannotMove) GTEST_SKIP() << "cannot move a process into " << cgroup.child();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cpu quota 0.5), 1 thread,"), std::string::npos) << r.output;

  // Outside it, the same machine is the whole CPU (as far as cgroups go).
  const RunResult unlimited = run_vtrain("check " + source_dir() + "/configs/synthetic-lenet.yaml");
  ASSERT_EQ(unlimited.exit_code, 0) << unlimited.output;
  EXPECT_EQ(unlimited.output.find("cpu quota"), std::string::npos) << unlimited.output;
}

TEST(CgroupLimitsOnThisHost, AMemoryLimitIsTheCpuDevicesMemory) {
  if (common::physical_memory_bytes() <= (uint64_t{3} << 30)) {
    GTEST_SKIP() << "this machine has no more memory than the 3 GiB limit the test sets";
  }
  TestCgroup cgroup("memory");
  if (!cgroup.why_not().empty()) GTEST_SKIP() << cgroup.why_not();
  const std::string limit = std::to_string(uint64_t{3} << 30);
  if (!write_text(cgroup.parent() + (cgroup.v2() ? "/memory.max" : "/memory.limit_in_bytes"),
                  limit)) {
    GTEST_SKIP() << "cannot set a memory limit on " << cgroup.parent();
  }
  const RunResult r = check_in(cgroup.child());
  if (r.exit_code == kCannotMove) GTEST_SKIP() << "cannot move a process into " << cgroup.child();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", " + common::format_bytes(uint64_t{3} << 30) + " of memory"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace vtrain
