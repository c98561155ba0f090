// vtrain across real hosts on one machine (ctest label hosts): two hosts
// made by tests/hosts/hosts.sh (a network namespace, an address on a bridge
// and a hostname each), two ranks a host, Open MPI over TCP between them.
// Training equals one rank, profiling groups by host, both hosts fill one
// perf DB, a checkpoint written on one host is resumed from another, and
// shaped or lossy links change the time of a step but not its numbers.
// Skips, saying why, where namespaces cannot be made (not root).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "tests/mpi_runs.h"
#include "tests/test_support.h"
#include "worker/train/checkpoint.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;

using mpi_runs::final_parameters;
using mpi_runs::run;
using mpi_runs::TempDir;
using mpi_runs::train_args;
using test_support::read_file;

std::string hosts_script() { return test_support::source_dir() + "/tests/hosts/hosts.sh"; }

std::string first_line(const std::string& path) {
  std::string line;
  std::getline(std::ifstream(path), line);
  return line;
}

// K hosts for one test, taken down when it ends; a reaper takes them down
// if this process dies first. Its destructor checks that nothing is left.
class HostSet {
 public:
  explicit HostSet(int k) {
    dir_ = folder_ / "hosts";
    std::string out;
    up_ = run(hosts_script() + " up " + dir_ + " " + std::to_string(k) + " " +
                  std::to_string(::getpid()),
              &out) == 0;
    EXPECT_TRUE(up_) << out;
    id_ = first_line(dir_ + "/id");
    subnet_ = first_line(dir_ + "/subnet");
  }
  ~HostSet() {
    if (!up_) return;
    std::string out;
    EXPECT_EQ(run(hosts_script() + " down " + dir_, &out), 0) << out;
    EXPECT_EQ(leftovers(id_, subnet_, &out), 0) << "left behind:\n" << out;
  }
  HostSet(const HostSet&) = delete;
  HostSet& operator=(const HostSet&) = delete;

  // What is left of hosts `id` on `subnet`: 0 nothing, 1 something (in *out).
  static int leftovers(const std::string& id, const std::string& subnet, std::string* out) {
    return run(hosts_script() + " leftovers " + id + " " + subnet, out);
  }

  // Prefix of a command line: mpirun across the hosts, bounded in time.
  std::string mpirun(const std::string& flags = "") const {
    return "timeout -k 10 300 " + hosts_script() + " mpirun " + dir_ + " --bind-to none " + flags + " ";
  }
  // Every host's link: RATE ("none": unlimited), one-way DELAY, LOSS.
  int shape(const std::string& rate, const std::string& delay = "0ms",
            const std::string& loss = "0%", std::string* out = nullptr) const {
    return run(hosts_script() + " shape " + dir_ + " " + rate + " " + delay + " " + loss, out);
  }
  // Runs hosts.sh COMMAND DIR ARGS (cut, kill); its exit code.
  int act(const std::string& command, const std::string& args) const {
    std::string out;
    const int rc = run(hosts_script() + " " + command + " " + dir_ + " " + args, &out);
    EXPECT_EQ(rc, 0) << out;
    return rc;
  }
  const std::string& dir() const { return dir_; }
  const std::string& subnet() const { return subnet_; }

 private:
  TempDir folder_;
  std::string dir_, id_, subnet_;
  bool up_ = false;
};

// Skips the test, with hosts.sh's reason, where hosts cannot be made.
#define SKIP_WITHOUT_HOSTS()                                                          \
  do {                                                                                \
    std::string why;                                                                  \
    if (run(hosts_script() + " check", &why) == 77) GTEST_SKIP() << why;             \
  } while (0)

const std::string kModel = mpi_runs::kSmoothLeNetConfig;
// Uneven over 2 hosts x 2 ranks: 5 + 19 on node1, 13 + 11 on node2.
const std::string kUnevenSplit = "--set balance.split=manual --set balance.manual=[5,19,13,11]";

TEST(HostsHarness, EachHostHasItsOwnNameAndAddress) {
  SKIP_WITHOUT_HOSTS();
  HostSet hosts(2);
  std::string out;
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 sh -c 'echo rank $OMPI_COMM_WORLD_RANK on $(hostname) "
                                 "at $(ip -4 -o addr show eth0 | cut -d\" \" -f7)'",
                &out),
            0)
      << out;
  for (const std::string& line : {"rank 0 on node1 at " + hosts.subnet() + ".1/24",
                                   "rank 1 on node1 at " + hosts.subnet() + ".1/24",
                                   "rank 2 on node2 at " + hosts.subnet() + ".2/24",
                                   "rank 3 on node2 at " + hosts.subnet() + ".2/24"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line << " not in:\n" << out;
  }
}

// A test process that dies (a crash, ctest's timeout) leaves nothing: its
// hosts' reaper kills what runs in them and removes them.
TEST(HostsHarness, HostsOfADeadOwnerAreTakenDown) {
  SKIP_WITHOUT_HOSTS();
  TempDir dir;
  const pid_t owner = test_support::spawn_shell("exec sleep 600");
  ASSERT_GT(owner, 0);
  std::string out;
  ASSERT_EQ(run(hosts_script() + " up " + dir / "h" + " 2 " + std::to_string(owner), &out), 0)
      << out;
  const std::string id = first_line(dir / "h/id"), subnet = first_line(dir / "h/subnet");
  const pid_t inside = test_support::spawn_shell("exec " + hosts_script() + " exec " + dir / "h" +
                                                 " node2 sleep 600");
  ASSERT_GT(inside, 0);
  ASSERT_TRUE(test_support::wait_until(
      [&] { return run("ip netns pids vtrain-" + id + "-node2 | grep -q .") == 0; },
      std::chrono::seconds(10)));
  EXPECT_NE(HostSet::leftovers(id, subnet, &out), 0);
  ::kill(owner, SIGKILL);
  EXPECT_EQ(test_support::wait_exit(owner, std::chrono::seconds(10)), -1);
  // The process in node2 is killed with it (a signal ends it).
  EXPECT_EQ(test_support::wait_exit(inside, std::chrono::seconds(20)), -1);
  EXPECT_TRUE(test_support::wait_until(
      [&] {
        return HostSet::leftovers(id, subnet, &out) == 0;
      },
      std::chrono::seconds(20)))
      << out;
  EXPECT_FALSE(fs::exists(dir / "h/id"));
}

// As mpi_test's split tests: 2 hosts x 2 ranks, uneven, against one rank.
TEST(Hosts, TrainingOnTwoHostsEqualsOneRank) {
  SKIP_WITHOUT_HOSTS();
  HostSet hosts(2);
  TempDir dir;
  std::string out;
  const std::string optimizer = "--set optimizer.momentum=0.9 --set optimizer.weight_decay=5e-4";
  ASSERT_EQ(run(train_args(dir / "one", 20, optimizer, kModel), &out), 0) << out;
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " +
                    train_args(dir / "hosts", 20, optimizer + " " + kUnevenSplit, kModel),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("node1"), std::string::npos) << out;
  EXPECT_NE(out.find("node2"), std::string::npos) << out;
  const std::vector<float> one = final_parameters(dir / "one");
  const std::vector<float> across = final_parameters(dir / "hosts");
  ASSERT_FALSE(one.empty());
  ASSERT_EQ(one.size(), across.size());
  const mpi_runs::Difference d = mpi_runs::compare(one, across);
  std::printf("after 20 steps, 2 hosts x 2 ranks (5,19 | 13,11) vs 1 rank: max abs diff %.3g "
              "(relative %.3g)\n",
              d.max_abs, d.relative);
  EXPECT_LE(d.relative, 1e-5);
}

// The ranks of one host share its cores and profile together; ranks of
// different hosts never do. Both hosts write the one perf DB at once, each
// its own device's rows, and the file stays whole.
TEST(Hosts, RanksProfileTogetherOnlyWithinTheirHostIntoOneSharedPerfDb) {
  SKIP_WITHOUT_HOSTS();
  HostSet hosts(2);
  TempDir dir;
  const std::string args = test_support::vtrain_binary() + " profile " +
                           test_support::source_dir() +
                           "/configs/synthetic-lenet.yaml --set profile.repeats=1 "
                           "--set device.threads=1 --set profile.batches=[16] "
                           "--set profile.micro_batches=undivided --db " + dir / "p.db";
  std::string out;
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " + args, &out), 0) << out;
  // Two groups of two, by host: ranks 0 and 1 (node1), 2 and 3 (node2).
  const std::regex together(R"(rank ([0-3]) \([^\n]*, together, ([12]) of 2\))");
  std::vector<std::string> seen;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), together);
       it != std::sregex_iterator(); ++it) {
    seen.push_back((*it)[1].str() + ":" + (*it)[2].str());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"0:1", "1:2", "2:1", "3:2"})) << out;
  ASSERT_EQ(run(test_support::vtrain_binary() + " db stats --db " + dir / "p.db", &out), 0) << out;
  EXPECT_NE(out.find("2 devices"), std::string::npos) << out;
  EXPECT_NE(out.find("host node1): 10 kernel, 1 step"), std::string::npos) << out;
  EXPECT_NE(out.find("host node2): 10 kernel, 1 step"), std::string::npos) << out;
  ASSERT_EQ(run("sqlite3 " + dir / "p.db" + " 'PRAGMA integrity_check'", &out), 0) << out;
  EXPECT_EQ(out, "ok\n");
  // Again: every host finds all of its device's rows.
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " + args, &out), 0) << out;
  EXPECT_EQ(out.find(" measured, 0 cached"), std::string::npos) << out;
  EXPECT_NE(out.find("0 kernel items measured, 5 cached; 0 steps measured, 1 cached"),
            std::string::npos)
      << out;
}

// The names in folder `dir`, sorted.
std::vector<std::string> folder_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Rank 0 (node1) writes the checkpoint, once; a resume whose rank 0 is on
// node2 reads it there and ends bit for bit where an uninterrupted run does.
TEST(Hosts, ACheckpointWrittenOnOneHostIsResumedOnAnother) {
  SKIP_WITHOUT_HOSTS();
  HostSet hosts(2);
  TempDir dir;
  std::string out;
  const auto args = [&](const std::string& ckpt, int steps, const std::string& metrics,
                        const std::string& extra = "") {
    return train_args(dir / ckpt, steps,
                      kUnevenSplit + " --set train.log_every=1 --metrics " + dir / metrics + " " +
                          extra,
                      kModel);
  };
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " + args("full", 24, "full.jsonl"), &out), 0) << out;
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " + args("part", 10, "a.jsonl"), &out), 0) << out;
  EXPECT_EQ(folder_names(dir / "part"),
            (std::vector<std::string>{".lock", "ckpt-0000000010.vtc"}));
  EXPECT_NE(read_file(dir / "part/.lock").find(" on node1"), std::string::npos);
  // node2 first: rank 0 (and 1) run on node2 now.
  std::ofstream(dir / "reversed") << "node2 slots=2\nnode1 slots=2\n";
  ASSERT_EQ(run("VTRAIN_HOSTS_HOSTFILE=" + dir / "reversed" + " " + hosts.mpirun() + "-np 4 " +
                    args("part", 24, "b.jsonl", "--resume --progress line"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("resumed from " + dir / "part/ckpt-0000000010.vtc"), std::string::npos)
      << out;
  EXPECT_NE(read_file(dir / "part/.lock").find(" on node2"), std::string::npos);
  std::vector<std::string> pieced = mpi_runs::logged_losses(dir / "a.jsonl");
  for (const std::string& l : mpi_runs::logged_losses(dir / "b.jsonl")) pieced.push_back(l);
  EXPECT_EQ(pieced, mpi_runs::logged_losses(dir / "full.jsonl"));
  const std::vector<float> full = final_parameters(dir / "full");
  ASSERT_FALSE(full.empty());
  EXPECT_EQ(final_parameters(dir / "part"), full);
}

// A number printed after `label` in `text` ("predicted step 293.99 ms"); -1 if none.
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  return at == std::string::npos ? -1 : std::strtod(text.c_str() + at + label.size(), nullptr);
}

// The median of the "step_ms" of a metrics file's step records, the first
// `skip` left out (the first steps warm up).
double median_step_ms(const std::string& path, size_t skip) {
  std::vector<double> ms;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const double v = number_after(line, "\"step_ms\": ");
    if (v >= 0) ms.push_back(v);
  }
  if (ms.size() <= skip) return -1;
  ms.erase(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(skip));
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Whether hosts.sh can make a one-way delay here (the kernel's sch_netem).
bool delay_available(const HostSet& hosts) {
  std::string out;
  const bool ok = hosts.shape("none", "0.5ms", "0%", &out) == 0;
  hosts.shape("none");
  return ok;
}

// On shaped links the plan's exchange is the measured one: never faster
// than the gradient can cross the link, the step it predicts printed
// beside the measured step (the figures of docs/multi-node.md), and the
// weights bit for bit those of the same plan on an unshaped link.
TEST(Hosts, ShapedLinksAreMeasuredAndLeaveTheNumbersExact) {
  SKIP_WITHOUT_HOSTS();
  HostSet hosts(2);
  TempDir dir;
  struct Link {
    std::string rate, delay;
    double bits_per_second;
  };
  std::vector<Link> links = {{"1gbit", "0.5ms", 1e9}, {"100mbit", "0ms", 1e8}};
  if (!delay_available(hosts)) {
    std::printf("no sch_netem in this kernel: 1gbit without its 0.5 ms delay\n");
    links[0].delay = "0ms";
  }
  const std::string auto_split =
      "--set balance.split=auto --set balance.allreduce=measure --set profile.repeats=1 "
      "--set balance.rebalance.enabled=false --set train.log_every=1 --set profile.db=" +
      dir / "perf.db";
  for (const Link& link : links) {
    SCOPED_TRACE(link.rate + " " + link.delay);
    std::string out;
    ASSERT_EQ(hosts.shape(link.rate, link.delay, "0%", &out), 0) << out;
    const std::string shaped = dir / ("shaped-" + link.rate);
    ASSERT_EQ(run(hosts.mpirun() + "-np 4 " +
                      train_args(shaped, 30,
                                 auto_split + " --metrics " + shaped + ".jsonl --set output.plan=" +
                                     shaped + ".plan",
                                 kModel),
                  &out),
              0)
        << out;
    const double allreduce = number_after(out, "gradients: ");
    const double predicted = number_after(out, "predicted step ");
    const double measured = median_step_ms(shaped + ".jsonl", 5);
    // 431,080 fp32 gradients cross the link at least once each way.
    const double bound_ms = 431080.0 * 32 / link.bits_per_second * 1e3;
    std::printf("%s %s: allreduce measured %.2f ms (link bound %.2f ms); predicted step %.2f ms, "
                "measured median step %.2f ms (%+.1f%%)\n",
                link.rate.c_str(), link.delay.c_str(), allreduce, bound_ms, predicted, measured,
                (predicted / measured - 1) * 100);
    EXPECT_GE(allreduce, 0.9 * bound_ms) << out;
    EXPECT_GE(predicted, allreduce) << out;
    ASSERT_GT(measured, 0) << read_file(shaped + ".jsonl");
    // The same plan on an unlimited link: the same weights, bit for bit.
    ASSERT_EQ(hosts.shape("none", "0ms", "0%", &out), 0) << out;
    const std::string plain = dir / ("plain-" + link.rate);
    ASSERT_EQ(run(hosts.mpirun() + "-np 4 " +
                      train_args(plain, 30, "--plan " + shaped + ".plan", kModel),
                  &out),
              0)
        << out;
    const std::vector<float> weights = final_parameters(shaped);
    ASSERT_FALSE(weights.empty());
    EXPECT_EQ(final_parameters(plain), weights);
  }
}

// 1% of the packets between the hosts lost: TCP sends them again, the run
// ends, and its weights are bit for bit those of a clean link.
TEST(Hosts, TrainingOverALossyLinkEndsWithTheSameWeights) {
  SKIP_WITHOUT_HOSTS();
  HostSet hosts(2);
  TempDir dir;
  std::string out;
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " + train_args(dir / "clean", 20, kUnevenSplit, kModel),
                &out),
            0)
      << out;
  if (hosts.shape("none", "0ms", "1%", &out) != 0) {
    if (out.find("packet loss needs") != std::string::npos) GTEST_SKIP() << out;
    FAIL() << out;
  }
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " + train_args(dir / "lossy", 20, kUnevenSplit, kModel),
                &out),
            0)
      << out;
  std::printf("20 steps over a link losing 1%% of its packets: %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  const std::vector<float> clean = final_parameters(dir / "clean");
  ASSERT_FALSE(clean.empty());
  EXPECT_EQ(final_parameters(dir / "lossy"), clean);
}

// A host lost mid-run, at a random moment after the first checkpoint: its
// ranks killed, or its link cut. The job ends in bounded time (a cut link:
// train.step_timeout, the watch's probe of 3 s, and mpirun giving up on the
// lost host's daemon after ~13 s of unacknowledged data, tcp_retries2=5)
// naming the lost host and ranks; every checkpoint is whole; and resuming
// on the surviving host continues as the lost job would have. One trial of
// each kind; `--gtest_repeat=10` makes the 20 of docs/multi-node.md.
constexpr int kStepTimeoutS = 5;

struct LossTrial {
  std::string kind;  // "kill" or "cut"
  double after_s;    // lost this long after the first checkpoint
};

void lose_a_host(const LossTrial& trial) {
  SCOPED_TRACE(trial.kind + " after " + std::to_string(trial.after_s) + " s");
  HostSet hosts(2);
  TempDir dir;
  const std::string ckpt = dir / "ck";
  const std::string lossy_run =
      hosts.mpirun() + "-np 4 " +
      train_args(ckpt, 3000,
                 kUnevenSplit + " --set train.epochs=1000 --set checkpoint.every=10 "
                                "--set checkpoint.keep=1000 --set train.step_timeout=" +
                     std::to_string(kStepTimeoutS),
                 kModel) +
      " >" + dir / "out" + " 2>&1";
  const pid_t job = test_support::spawn_shell(lossy_run);
  ASSERT_GT(job, 0);
  ASSERT_TRUE(test_support::wait_until([&] { return worker::latest_checkpoint(ckpt).has_value(); },
                                       std::chrono::seconds(120)))
      << read_file(dir / "out");
  std::this_thread::sleep_for(std::chrono::duration<double>(trial.after_s));
  const auto lost = std::chrono::steady_clock::now();
  if (trial.kind == "kill") {
    hosts.act("kill", "node2 vtrain");
  } else {
    hosts.act("cut", "node2");
  }
  const std::optional<int> code = test_support::wait_exit(job, std::chrono::seconds(180));
  const double exit_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - lost).count();
  const std::string out = read_file(dir / "out");
  ASSERT_TRUE(code.has_value()) << "the job hung: killed after 180 s\n" << out;
  EXPECT_NE(*code, 0) << out;
  EXPECT_NE(*code, 124) << "the job hung until timeout killed it\n" << out;
  EXPECT_LT(exit_s, 90.0) << out;
  // Open MPI names a killed rank and its node; the step watch the ranks
  // that stopped answering and their host.
  const std::string named = trial.kind == "kill" ? " on node node2 exited on signal 9"
                                                 : "(host node2): its host or the link to it is lost";
  EXPECT_NE(out.find(named), std::string::npos) << out;
  // Every checkpoint reads back whole (load_checkpoint checks the CRC).
  int whole = 0;
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    const std::string name = entry.path().filename();
    if (name.rfind("ckpt-", 0) != 0) continue;
    EXPECT_NO_THROW(worker::load_checkpoint(entry.path())) << name;
    ++whole;
  }
  const std::optional<std::string> last = worker::latest_checkpoint(ckpt);
  ASSERT_TRUE(last.has_value());
  const int64_t step = worker::load_checkpoint(*last).step;
  std::printf("trial %s %.2f s after the first checkpoint: job ended %.1f s after the loss "
              "(exit code %d); %d checkpoints whole, the last at step %lld\n",
              trial.kind.c_str(), trial.after_s, exit_s, *code, whole,
              static_cast<long long>(step));
  // Resumed on node1 alone (2 ranks, even split), and on both hosts as if
  // nothing was lost: 10 steps on, the same weights within the split tests'
  // tolerance.
  fs::copy(ckpt, dir / "both", fs::copy_options::recursive);
  std::ofstream(dir / "survivors") << "node1 slots=2\n";
  const std::string to = std::to_string(step + 10);
  std::string resumed;
  ASSERT_EQ(run("VTRAIN_HOSTS_HOSTFILE=" + dir / "survivors" + " " + hosts.mpirun() + "-np 2 " +
                    train_args(ckpt, step + 10, "--resume --set balance.split=even", kModel),
                &resumed),
            0)
      << resumed;
  EXPECT_NE(resumed.find("resumed from " + *last), std::string::npos) << resumed;
  if (trial.kind == "cut") {
    hosts.act("uncut", "node2");
  }
  ASSERT_EQ(run(hosts.mpirun() + "-np 4 " +
                    train_args(dir / "both", step + 10, "--resume " + kUnevenSplit, kModel),
                &resumed),
            0)
      << resumed;
  const std::vector<float> survivors = final_parameters(ckpt);
  const std::vector<float> both = final_parameters(dir / "both");
  ASSERT_FALSE(both.empty());
  ASSERT_EQ(survivors.size(), both.size());
  EXPECT_LE(mpi_runs::compare(both, survivors).relative, 1e-5);
}

// A moment in [0, 3) s, printed with the trial.
double random_moment() {
  static std::mt19937 rng(std::random_device{}());
  return std::uniform_real_distribution<double>(0.0, 3.0)(rng);
}

TEST(HostLoss, AHostWhoseRanksAreKilledEndsTheJobAndTheSurvivorsResume) {
  SKIP_WITHOUT_HOSTS();
  lose_a_host({"kill", random_moment()});
}

TEST(HostLoss, AHostWhoseLinkIsCutEndsTheJobAndTheSurvivorsResume) {
  SKIP_WITHOUT_HOSTS();
  lose_a_host({"cut", random_moment()});
}

}  // namespace
}  // namespace vtrain
