// Plans: the YAML format (round trip, every kind of bad input named by line
// and key), and the perf DB -> balancer -> plan path on a synthetic DB with
// two devices, one twice as fast (split, WR / WD workspaces, mismatches).
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <set>
#include <string>
#include <utility>

#include "balancer/plan.h"
#include "perfdb/perf_db.h"
#include "tests/engine_support.h"
#include "tests/test_support.h"
#include "worker/engine/graph.h"
#include "worker/profile/planning.h"
#include "worker/profile/profiler.h"

namespace vtrain {
namespace {

using test_support::error_message;
using test_support::layer_spec;
using test_support::TempDir;

worker::Graph small_graph() {
  using worker::LayerType;
  return worker::Graph::build({layer_spec("data", LayerType::kInput, {}),
                               layer_spec("c1", LayerType::kConv, {"data"}, 8, 3),
                               layer_spec("r1", LayerType::kRelu, {"c1"}),
                               layer_spec("c2", LayerType::kConv, {"r1"}, 8, 3),
                               layer_spec("fc", LayerType::kFc, {"c2"}, 10)},
                              {1, 3, 8, 8});
}

balancer::TrainingPlan sample_plan() {
  balancer::TrainingPlan p;
  p.model = "m";
  p.settings = {common::Precision::kBf16, common::LayoutChoice::kNhwc, common::AutoOnOff::kOn};
  p.global_batch = 12;
  p.workspace_policy = balancer::WorkspacePolicy::kWd;
  p.workspace_limit = 4096;
  p.predicted_step_ms = 2.5;
  p.split_ms = 2.25;
  p.even_split_ms = 3.0;
  p.ideal_step_ms = 2.0;
  balancer::RankPlan r0;
  r0.device = {"fast \"gpu\"", std::nullopt};
  r0.batch = 8;
  r0.predicted_ms = 2.5;
  r0.workspace_bytes = 4096;
  r0.activations = common::ActivationBytes{100, 20, 3};
  r0.kernels.push_back({"c1", common::ConvKind::kForward, {{"winograd", 4}, {"direct", 4}}, 0, 1024, 1.25});
  r0.kernels.push_back({"c1", common::ConvKind::kBackwardFilter, {{"direct", 8}}, 1024, 3072, 0.5});
  balancer::RankPlan r1;
  r1.device = {"slow", 4};
  r1.precision = common::Precision::kFp16;
  r1.batch = 4;
  r1.kernels.push_back({"c1", common::ConvKind::kForward, {{"direct", 4}}, 0, 0, 1.0});
  p.ranks = {r0, r1};
  return p;
}

TEST(PlanFile, RoundTripsThroughYamlAndDisk) {
  const balancer::TrainingPlan p = sample_plan();
  const std::string text = balancer::plan_to_yaml(p);
  const balancer::TrainingPlan q = balancer::parse_plan(text, "p.yaml");
  EXPECT_EQ(balancer::plan_to_yaml(q), text);
  EXPECT_EQ(q.ranks[0].device, (common::DeviceLabel{"fast \"gpu\"", std::nullopt}));
  EXPECT_EQ(q.ranks[1].device, (common::DeviceLabel{"slow", 4}));
  EXPECT_NE(text.find("- device: \"slow\"\n    threads: 4\n"), std::string::npos) << text;
  EXPECT_EQ(q.ranks[0].kernels[0].calls, p.ranks[0].kernels[0].calls);
  EXPECT_EQ(q.ranks[0].kernels[1].workspace_offset, 1024u);
  ASSERT_TRUE(q.even_split_ms.has_value());
  EXPECT_DOUBLE_EQ(*q.even_split_ms, 3.0);
  EXPECT_EQ(q.ideal_step_ms, 2.0);
  EXPECT_EQ(q.ranks[0].activations, (common::ActivationBytes{100, 20, 3}));
  EXPECT_FALSE(q.ranks[1].activations);
  EXPECT_EQ(q.model, "m");
  EXPECT_EQ(q.settings, p.settings);
  EXPECT_EQ(q.ranks[0].precision, std::nullopt);
  EXPECT_EQ(q.ranks[1].precision, common::Precision::kFp16);
  TempDir dir;
  balancer::save_plan(p, dir.path("plan.yaml"));
  EXPECT_EQ(balancer::plan_to_yaml(balancer::load_plan(dir.path("plan.yaml"))), text);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1)
      << "a temporary was left beside " << dir.path("plan.yaml");
}

// Version 1 plans held how the model is computed as "@" suffixes of
// `model`: they read as the same typed fields, and write back as version 3.
TEST(PlanFile, Version1ModelSuffixesReadAsTypedFields) {
  const std::string v1 =
      "vtrain_plan: 1\nmodel: \"m@bf16@nhwc@fuse_relu=on\"\nglobal_batch: 4\n"
      "ranks:\n  - device: \"d\"\n    batch: 4\n";
  const balancer::TrainingPlan q = balancer::parse_plan(v1, "old.yaml");
  EXPECT_EQ(q.model, "m");
  EXPECT_EQ(q.settings, (common::ComputeSettings{common::Precision::kBf16,
                                                 common::LayoutChoice::kNhwc,
                                                 common::AutoOnOff::kOn}));
  const std::string written = balancer::plan_to_yaml(q);
  EXPECT_NE(written.find("vtrain_plan: 3\nmodel: \"m\"\nprecision: bf16\nlayout: nhwc\n"
                         "fuse_relu: on\n"),
            std::string::npos)
      << written;
  const balancer::TrainingPlan plain = balancer::parse_plan(
      "vtrain_plan: 1\nmodel: m\nglobal_batch: 4\nranks: [{batch: 4}]\n", "old.yaml");
  EXPECT_EQ(plain.model, "m");
  EXPECT_EQ(plain.settings, common::ComputeSettings{});
  EXPECT_EQ(error_message<balancer::PlanError>([] {
              balancer::parse_plan("vtrain_plan: 1\nmodel: m@fp64\nglobal_batch: 4\n"
                                   "ranks: [{batch: 4}]\n",
                                   "old.yaml");
            }),
            "old.yaml:2: model: unknown suffix '@fp64' (known: a precision, a layout or "
            "fuse_relu=on|off)");
}

// Versions 1 and 2 held a CPU's thread count in `device:` after its name
// (" (2 threads)"): it reads as the device's name and threads, and writes
// back as version 3's two fields; any other text is a name as it is (a GPU,
// a plan written before labels held the count). threads: came with
// version 3, and is refused in an older plan.
TEST(PlanFile, Version2DeviceLabelsReadAsNameAndThreads) {
  const std::string v2 =
      "vtrain_plan: 2\nmodel: m\nglobal_batch: 6\nranks:\n"
      "  - {device: \"AMD EPYC (cpus 0,1) (2 threads)\", batch: 2}\n"
      "  - {device: \"AMD EPYC (1 thread)\", batch: 2}\n"
      "  - {device: \"NVIDIA H200\", batch: 2}\n";
  for (const std::string& format : {std::string("1"), std::string("2")}) {
    std::string text = v2;
    text.replace(text.find('2'), 1, format);
    const balancer::TrainingPlan q = balancer::parse_plan(text, "old.yaml");
    EXPECT_EQ(q.ranks[0].device, (common::DeviceLabel{"AMD EPYC (cpus 0,1)", 2})) << format;
    EXPECT_EQ(q.ranks[1].device, (common::DeviceLabel{"AMD EPYC", 1})) << format;
    EXPECT_EQ(q.ranks[2].device, (common::DeviceLabel{"NVIDIA H200", std::nullopt})) << format;
  }
  const balancer::TrainingPlan q = balancer::parse_plan(v2, "old.yaml");
  const std::string written = balancer::plan_to_yaml(q);
  EXPECT_NE(written.find("- device: \"AMD EPYC (cpus 0,1)\"\n    threads: 2\n"), std::string::npos)
      << written;
  EXPECT_EQ(balancer::parse_plan(written, "new.yaml").ranks[0].device, q.ranks[0].device);
  // Format 3 takes the name as it is: the text is no longer parsed.
  std::string v3 = v2;
  v3.replace(v3.find('2'), 1, "3");
  EXPECT_EQ(balancer::parse_plan(v3, "new.yaml").ranks[1].device,
            (common::DeviceLabel{"AMD EPYC (1 thread)", std::nullopt}));
  std::string with_threads = v2;
  with_threads.replace(with_threads.find("batch: 2}"), 9, "threads: 2, batch: 2}");
  EXPECT_EQ(error_message<balancer::PlanError>(
                [&] { balancer::parse_plan(with_threads, "old.yaml"); }),
            "old.yaml:5: ranks[0].threads: plan format 2 has no threads (it is part of device:); "
            "threads came with format 3");
}

TEST(DescribePlan, TwoHundredRanksKeepEveryLineWhole) {
  balancer::TrainingPlan p = sample_plan();
  p.global_batch = 0;
  p.ranks.clear();
  for (int r = 0; r < 200; ++r) {
    balancer::RankPlan rank = sample_plan().ranks[0];
    rank.device = {"NVIDIA H100 80GB HBM3 (node " + std::to_string(r) + ")", std::nullopt};
    rank.kernels.push_back({"c2", common::ConvKind::kForward, {{"a_long_algorithm_name", 1}}, 0, 0, 1.0});
    for (int k = 0; k < 40; ++k) {
      rank.kernels.back().calls.push_back({"algorithm_" + std::to_string(k), 1});
    }
    p.global_batch += rank.batch;
    p.ranks.push_back(rank);
  }
  const std::string text = worker::describe_plan(p);
  const std::string first = text.substr(0, text.find('\n'));
  std::string split;
  for (int r = 0; r < 200; ++r) split += (r ? "+" : "") + std::to_string(p.ranks[r].batch);
  EXPECT_EQ(first, "plan: split " + split + " of 1600, workspace wd 0.0 MiB, predicted step 2.50 ms");
  EXPECT_NE(text.find("  rank 199 (NVIDIA H100 80GB HBM3 (node 199)): batch 8, predicted 2.50 ms"),
            std::string::npos);
  // A kernel's calls are listed whole, however many there are.
  const std::string calls = balancer::describe_calls(p.ranks[199].kernels.back().calls);
  ASSERT_GT(calls.size(), 512u);
  EXPECT_NE(text.find(calls + "    1.000 ms"), std::string::npos);
}

TEST(PlanFile, BadPlansNameTheLineAndKey) {
  const std::string good = balancer::plan_to_yaml(sample_plan());
  auto error = [](const std::string& text) {
    return error_message<balancer::PlanError>([&] { balancer::parse_plan(text, "p.yaml"); });
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_EQ(error("model: m\n"),
            "p.yaml: vtrain_plan: missing (the plan format version; is this a plan?)");
  EXPECT_EQ(error(replaced("vtrain_plan: 3", "vtrain_plan: 7")),
            "p.yaml:2: vtrain_plan: plan format version 7 is not supported (this vtrain reads "
            "versions 1 to 3)");
  EXPECT_NE(error(replaced("threads: 4", "threads: 0")).find("ranks[1].threads: "),
            std::string::npos)
      << error(replaced("threads: 4", "threads: 0"));
  EXPECT_NE(error(replaced("layout: nhwc", "layout: nhcw"))
                .find("p.yaml:5: layout: unknown layout 'nhcw' (known: auto, nchw, nhwc)"),
            std::string::npos)
      << error(replaced("layout: nhwc", "layout: nhcw"));
  EXPECT_EQ(error(replaced("global_batch: 12", "global_batch: 13")).substr(0, 8), "p.yaml:1");
  EXPECT_NE(error(replaced("global_batch: 12", "global_batch: 13"))
                .find("ranks: the ranks' batches sum to 12, global_batch is 13"),
            std::string::npos);
  EXPECT_NE(error(replaced("[direct, 4]]", "[direct, 3]]"))
                .find("ranks[0].kernels[0].calls: the calls cover 7 images, the rank's batch is 8"),
            std::string::npos)
      << error(replaced("[direct, 4]]", "[direct, 3]]"));
  EXPECT_NE(error(replaced("workspace_offset: 1024", "workspace_offset: 2048"))
                .find("lies outside the rank's workspace of 4096 bytes"),
            std::string::npos);
  EXPECT_NE(error(replaced("kind: Forward", "kind: Sideways"))
                .find("kind: unknown value 'Sideways'"),
            std::string::npos);
  EXPECT_NE(error(replaced("memory_policy", "memroy_policy")).find("memroy_policy: unknown key"),
            std::string::npos);
  EXPECT_NE(error("vtrain_plan: 1\nmodel: [\n").find("p.yaml:3:1: YAML syntax error"),
            std::string::npos)
      << error("vtrain_plan: 1\nmodel: [\n");
  EXPECT_NE(error_message<balancer::PlanError>([] { balancer::load_plan("/nonexistent/p.yaml"); })
                .find("cannot open plan /nonexistent/p.yaml"),
            std::string::npos);
}

// A perf DB with two devices on small_graph(): "fast" runs everything in
// half the time of "slow". A call costs a fixed 0.05 ms plus a per-image
// time; winograd's is 30% below direct's but it needs 1 KiB of workspace per
// image, so under a limit the fewest calls that fit win.
class PlanningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::make_unique<perfdb::PerfDb>(dir_.path("perf.db"));
    fast_ = add_device("fast", 1.0);
    slow_ = add_device("slow", 2.0);
  }
  worker::PlanDevice add_device(const std::string& name, double factor) {
    perfdb::Device d;
    d.name = name;
    d.backend = "cuda";
    d.memory_bytes = 1ull << 30;
    d.library_version = "test";
    const perfdb::DeviceId id = db_->upsert_device(d);
    std::vector<perfdb::StepMeasurement> steps;
    for (int64_t b : {4, 8, 12, 16, 20, 24}) {
      steps.push_back({worker::model_key(graph_, {}), b, "none", 0, worker::kProfiledStepPlan,
                       factor * (1.0 + 0.5 * b), static_cast<uint64_t>(b) << 20, 0, {}});
      // A row of an older profiler (forward + backward only), which sorts
      // first: the planner must not take it.
      steps.push_back({worker::model_key(graph_, {}), b, "none", 0, "auto", 1000.0, 1, 0, {}});
      const worker::PlanDevice plain{{name}, id, d.memory_bytes,
                                     [](int64_t) { return worker::Layout::kPlain; }};
      std::vector<perfdb::KernelSample> samples;
      for (const auto& k : kernels(plain, b)) {
        for (int64_t m = 1; m <= b; m *= 2) {
          samples.push_back({k, {"direct", m, factor * (0.05 + 0.1 * m), std::nullopt, 0, 0}});
          samples.push_back({k, {"winograd", m, factor * (0.05 + 0.07 * m), std::nullopt,
                                 static_cast<uint64_t>(m) << 10, 0}});
        }
        if ((b & (b - 1)) != 0) {  // b itself for the undivided policy
          samples.push_back({k, {"direct", b, factor * (0.05 + 0.1 * b), std::nullopt, 0, 0}});
          samples.push_back({k, {"winograd", b, factor * (0.05 + 0.07 * b), std::nullopt,
                                 static_cast<uint64_t>(b) << 10, 0}});
        }
      }
      db_->record_kernel_measurements(id, samples);
    }
    db_->record_step_measurements(id, steps);
    return {{name}, id, d.memory_bytes, [](int64_t) { return worker::Layout::kPlain; }};
  }
  // The algorithms the workspace plan of graph_ computed in `precision` on
  // the fast device alone at batch 16 calls.
  std::set<std::string> algorithms_planned(common::Precision precision,
                                           const worker::StepPricing& pricing = {}) {
    balancer::BatchSplit split;
    split.batch = {16};
    const std::vector<worker::PlanDevice> devices{fast_};
    std::set<std::string> algorithms;
    const balancer::TrainingPlan plan =
        worker::plan_workspaces(graph_, {.precision = precision}, *db_, devices, split, pricing);
    for (const auto& k : plan.ranks[0].kernels) {
      for (const auto& call : k.calls) algorithms.insert(call.algorithm);
    }
    return algorithms;
  }
  // The conv kernels of graph_ computed in `precision` at batch b.
  std::vector<perfdb::KernelSignature> kernels(
      const worker::PlanDevice& d, int64_t b,
      common::Precision precision = common::Precision::kFp32) {
    const worker::Graph& g = graph_;
    const auto descs = worker::activation_descs(g, {.precision = precision}, d.layout, b);
    std::vector<perfdb::KernelSignature> out;
    for (int i = 0; i < g.size(); ++i) {
      if (g.layer(i).type != worker::LayerType::kConv) continue;
      const int in = g.inputs(i)[0];
      const auto p = worker::conv_problem(g.layer(i), descs[in], descs[i]);
      for (auto kind : {worker::ConvKind::kForward, worker::ConvKind::kBackwardData,
                        worker::ConvKind::kBackwardFilter}) {
        out.push_back(worker::kernel_signature(kind, p));
      }
    }
    return out;
  }
  // For every conv kernel of graph_ computed in `precision` on the fast
  // device at batch 16, a row per (algorithm, ms) of an undivided call.
  void add_rows(std::vector<perfdb::KernelSample>& samples, common::Precision precision,
                std::initializer_list<std::pair<const char*, double>> rows) {
    for (const auto& k : kernels(fast_, 16, precision)) {
      for (const auto& [algorithm, ms] : rows) {
        samples.push_back({k, {algorithm, 16, ms, std::nullopt, 0, 0}});
      }
    }
  }

  TempDir dir_;
  worker::Graph graph_ = small_graph();
  std::unique_ptr<perfdb::PerfDb> db_;
  worker::PlanDevice fast_, slow_;
};

TEST_F(PlanningTest, FastDeviceGetsTheLargerShareAndThePlanFitsTheModel) {
  const std::vector<worker::PlanDevice> devices{fast_, slow_};
  const balancer::BatchSplit split = worker::plan_split(graph_, {}, *db_, devices, 24, {.granularity = 4});
  // t_fast(b) = 1 + b/2, t_slow(b) = 2 + b: 16 + 8 gives 9 and 10, the best.
  EXPECT_EQ(split.batch, (std::vector<int64_t>{16, 8}));
  ASSERT_TRUE(split.even_split_time_ms.has_value());
  EXPECT_DOUBLE_EQ(*split.even_split_time_ms, 14.0);

  const balancer::TrainingPlan plan =
      worker::plan_workspaces(graph_, {}, *db_, devices, split, {balancer::WorkspacePolicy::kUndivided, 0});
  EXPECT_EQ(worker::plan_mismatch(plan, graph_, {}, 2, 24), std::nullopt);
  EXPECT_EQ(plan.global_batch, 24);
  // c1's backward-data never runs (its input is the data): 5 kernels.
  ASSERT_EQ(plan.ranks[0].kernels.size(), 5u);
  for (const auto& k : plan.ranks[0].kernels) {
    EXPECT_EQ(k.calls, (std::vector<balancer::MicroBatch>{{"winograd", 16}})) << k.layer;
  }
  EXPECT_EQ(plan.ranks[0].workspace_bytes, 16u << 10);
  EXPECT_NE(worker::describe_plan(plan).find("split 16+8 of 24"), std::string::npos)
      << worker::describe_plan(plan);
  EXPECT_NE(worker::describe_plan(plan).find("even split 14.00 ms (1.40x)"), std::string::npos)
      << worker::describe_plan(plan);
  // Where no even split exists the print says why instead of a speedup.
  balancer::TrainingPlan odd = plan;
  odd.even_split_ms.reset();
  odd.global_batch = 25;
  EXPECT_NE(worker::describe_plan(odd).find("no even split to compare (25 samples do not divide "
                                            "among 2 ranks)"),
            std::string::npos)
      << worker::describe_plan(odd);

  const auto executions = worker::conv_executions(plan.ranks[1]);
  ASSERT_EQ(executions.size(), 2u);
  EXPECT_EQ(executions[0].layer, "c1");
  EXPECT_TRUE(executions[0].kernels[1].calls.empty());
  EXPECT_EQ(executions[1].kernels[2].calls[0].size, 8);
}

// The perf DB keeps every precision's algorithms side by side: a TF32
// tensor-core variant measured by a tf32 job ("direct/tf32", fastest here)
// is a choice for tf32 plans only; an fp32 plan of the same kernels keeps
// to FMA math.
TEST_F(PlanningTest, Tf32AlgorithmsArePlannedForTf32JobsOnly) {
  std::vector<perfdb::KernelSample> samples;
  add_rows(samples, common::Precision::kFp32, {{"direct/tf32", 0.01}});
  db_->record_kernel_measurements(fast_.id, samples);
  EXPECT_EQ(algorithms_planned(common::Precision::kFp32), std::set<std::string>{"winograd"});
  EXPECT_EQ(algorithms_planned(common::Precision::kTf32), std::set<std::string>{"direct/tf32"});
  EXPECT_TRUE(worker::conv_algorithm_allowed("implicit_gemm", common::Precision::kFp32));
  EXPECT_FALSE(worker::conv_algorithm_allowed("implicit_gemm/tf32", common::Precision::kFp32));
  EXPECT_FALSE(worker::conv_algorithm_allowed("implicit_gemm/tf32", common::Precision::kBf16));
  EXPECT_TRUE(worker::conv_algorithm_allowed("implicit_gemm/tf32", common::Precision::kTf32));
}

// The CUDA backend's half configurations (mu-cuDNN's): fp16 kernels come
// as "<name>/pseudo_half" (f32 compute) and "<name>/true_half" (f16
// compute), bf16 ones as "<name>/pseudo_bf16". A plan picks among its own
// precision's only, whatever else a shared perf DB holds for the kernel.
TEST_F(PlanningTest, HalfAlgorithmsArePlannedForTheirPrecisionOnly) {
  const common::Precision fp16 = common::Precision::kFp16;
  const common::Precision bf16 = common::Precision::kBf16;
  // Each precision's kernels with its own configurations, and the fastest rows
  // with another precision's names.
  std::vector<perfdb::KernelSample> samples;
  add_rows(samples, fp16,
           {{"direct/pseudo_half", 0.03}, {"direct/true_half", 0.02},
            {"direct/pseudo_bf16", 0.001}, {"direct/tf32", 0.001}});
  add_rows(samples, bf16,
           {{"direct/pseudo_bf16", 0.02}, {"direct/true_half", 0.001},
            {"direct/pseudo_half", 0.001}});
  // An fp32 job's kernels: a half name beside them is never its choice.
  add_rows(samples, common::Precision::kFp32, {{"direct/true_half", 0.001}});
  db_->record_kernel_measurements(fast_.id, samples);
  EXPECT_EQ(algorithms_planned(fp16), std::set<std::string>{"direct/true_half"});
  EXPECT_EQ(algorithms_planned(bf16), std::set<std::string>{"direct/pseudo_bf16"});
  EXPECT_EQ(algorithms_planned(common::Precision::kFp32), std::set<std::string>{"winograd"});
  for (const std::string name : {"implicit_gemm/pseudo_half", "implicit_gemm/true_half"}) {
    EXPECT_TRUE(worker::conv_algorithm_allowed(name, common::Precision::kFp16)) << name;
    for (const auto p : {common::Precision::kFp32, common::Precision::kTf32,
                         common::Precision::kBf16}) {
      EXPECT_FALSE(worker::conv_algorithm_allowed(name, p))
          << name << " " << common::precision_name(p);
    }
  }
  EXPECT_TRUE(
      worker::conv_algorithm_allowed("implicit_gemm/pseudo_bf16", common::Precision::kBf16));
  EXPECT_FALSE(
      worker::conv_algorithm_allowed("implicit_gemm/pseudo_bf16", common::Precision::kFp16));
  EXPECT_FALSE(
      worker::conv_algorithm_allowed("implicit_gemm/pseudo_bf16", common::Precision::kFp32));
  EXPECT_FALSE(worker::conv_algorithm_allowed("implicit_gemm/tf32", common::Precision::kFp16));
  // The CPU's bf16 algorithms keep their plain names.
  EXPECT_TRUE(worker::conv_algorithm_allowed("direct", common::Precision::kBf16));
  EXPECT_TRUE(worker::conv_algorithm_allowed("direct", common::Precision::kFp16));
}

// cuDNN's graph-API engines ("eng<index>...", conv.cudnn_graph) in a
// shared perf DB are planned only for a job that offers them: a job
// without them would not find the algorithm its plan names.
TEST_F(PlanningTest, GraphEnginesArePlannedOnlyWhereTheJobOffersThem) {
  const common::Precision bf16 = common::Precision::kBf16;
  std::vector<perfdb::KernelSample> samples;
  add_rows(samples, bf16,
           {{"direct/pseudo_bf16", 0.02}, {"eng12_k2=1_k3=0/pseudo_bf16", 0.005}});
  db_->record_kernel_measurements(fast_.id, samples);
  EXPECT_EQ(algorithms_planned(bf16), std::set<std::string>{"direct/pseudo_bf16"});
  const worker::StepPricing graph_engines{{.graph_engines = true}, memory::Policy::kNone};
  EXPECT_EQ(algorithms_planned(bf16, graph_engines),
            std::set<std::string>{"eng12_k2=1_k3=0/pseudo_bf16"});
  EXPECT_TRUE(worker::is_graph_engine("eng0/pseudo_half"));
  EXPECT_FALSE(worker::is_graph_engine("engine"));
  EXPECT_FALSE(worker::is_graph_engine("implicit_gemm/pseudo_bf16"));
  EXPECT_FALSE(worker::conv_algorithm_allowed("eng3/true_half", common::Precision::kFp16));
  EXPECT_TRUE(worker::conv_algorithm_allowed("eng3/true_half", common::Precision::kFp16, true));
  EXPECT_FALSE(worker::conv_algorithm_allowed("eng3/true_half", common::Precision::kBf16, true));
}

TEST_F(PlanningTest, WorkspacePoliciesStayWithinTheirLimits) {
  const std::vector<worker::PlanDevice> devices{fast_, slow_};
  balancer::BatchSplit split;
  split.batch = {16, 8};
  // WR, 4 KiB per kernel: winograd fits 4 images per call.
  const balancer::TrainingPlan wr = worker::plan_workspaces(graph_, {}, *db_, devices, split, {balancer::WorkspacePolicy::kWr, 4096});
  for (const auto& k : wr.ranks[0].kernels) {
    EXPECT_LE(k.workspace_bytes, 4096u);
    EXPECT_EQ(k.calls.front(), (balancer::MicroBatch{"winograd", 4})) << k.layer << " " << common::conv_kind_name(k.kind);
  }
  // WD, 20 KiB for all five kernels of rank 0: segments disjoint and inside.
  const balancer::TrainingPlan wd =
      worker::plan_workspaces(graph_, {}, *db_, devices, split, {balancer::WorkspacePolicy::kWd, 20 << 10});
  for (const auto& r : wd.ranks) {
    EXPECT_LE(r.workspace_bytes, 20u << 10);
    std::vector<std::pair<uint64_t, uint64_t>> segments;
    for (const auto& k : r.kernels) segments.push_back({k.workspace_offset, k.workspace_bytes});
    std::sort(segments.begin(), segments.end());
    for (size_t i = 0; i + 1 < segments.size(); ++i) {
      EXPECT_LE(segments[i].first + segments[i].second, segments[i + 1].first);
    }
    if (!segments.empty()) {
      EXPECT_LE(segments.back().first + segments.back().second, r.workspace_bytes);
    }
  }
  // The plan's text reads back unchanged.
  EXPECT_EQ(balancer::plan_to_yaml(balancer::parse_plan(balancer::plan_to_yaml(wd), "x")),
            balancer::plan_to_yaml(wd));
  // A budget below every kernel's least workspace config: infeasible (direct needs none,
  // so this holds only when it is removed; here 0 bytes still fits all-direct).
  const balancer::TrainingPlan tight = worker::plan_workspaces(graph_, {}, *db_, devices, split, {balancer::WorkspacePolicy::kWd, 1});
  for (const auto& k : tight.ranks[0].kernels) EXPECT_EQ(k.calls.front().algorithm, "direct");
}

TEST_F(PlanningTest, MissingMeasurementsAndMismatchesAreClearErrors) {
  const std::vector<worker::PlanDevice> devices{fast_, slow_};
  balancer::BatchSplit split;
  split.batch = {20, 6};  // 6 was never measured
  EXPECT_NE(error_message<std::runtime_error>([&] {
              worker::plan_workspaces(graph_, {}, *db_, devices, split, {balancer::WorkspacePolicy::kUndivided, 0});
            }).find("device slow: no measurements of c1/Forward at batch 6"),
            std::string::npos);
  split.batch = {16, 8};
  const balancer::TrainingPlan plan =
      worker::plan_workspaces(graph_, {}, *db_, devices, split, {balancer::WorkspacePolicy::kUndivided, 0});
  EXPECT_EQ(worker::plan_mismatch(plan, graph_, {}, 3, 24), "the plan has 2 ranks, the job has 3");
  EXPECT_EQ(worker::plan_mismatch(plan, graph_, {}, 2, 24, memory::Policy::kConv),
            "the plan was made for memory.policy none, the config's memory.policy is conv");
  EXPECT_EQ(worker::plan_mismatch(plan, graph_, {}, 2, 32),
            "the plan's global_batch is 24, the config's train.batch is 32");
  balancer::TrainingPlan other = plan;
  other.model = "something else";
  EXPECT_NE(worker::plan_mismatch(other, graph_, {}, 2, 24)->find("another model"), std::string::npos);
  // How the model is computed is the plan's too: a config that forces a
  // layout or the bias-relu pairing ran other steps than the plan priced.
  const std::optional<std::string> layout =
      worker::plan_mismatch(plan, graph_, {.layout = common::LayoutChoice::kNhwc}, 2, 24);
  ASSERT_TRUE(layout.has_value());
  EXPECT_NE(layout->find("this config's is " + graph_.signature() +
                         " (precision fp32, layout nhwc, fuse_relu auto)"),
            std::string::npos)
      << *layout;
  EXPECT_TRUE(
      worker::plan_mismatch(plan, graph_, {.fuse_relu = common::AutoOnOff::kOn}, 2, 24).has_value());
  other = plan;
  other.ranks[1].kernels.pop_back();
  EXPECT_EQ(worker::plan_mismatch(other, graph_, {}, 2, 24),
            "rank 1: the plan does not configure c2 BackwardFilter");
  // Each rank runs on the device the plan timed for it.
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"fast"}), std::nullopt);
  EXPECT_EQ(worker::plan_device_mismatch(plan, 1, {"slow"}), std::nullopt);
  EXPECT_EQ(worker::plan_device_mismatch(plan, 1, {"fast"}),
            "rank 1 was planned for device 'slow', but it runs on 'fast' (plan again for these "
            "devices)");
  // The cores a CPU process is pinned to, and the " #rank" of older
  // offline plans, are not the hardware; a plan that names none is taken.
  balancer::TrainingPlan pinned = plan;
  pinned.ranks[1].device = {"slow (cpus 2,3)"};
  EXPECT_EQ(worker::plan_device_mismatch(pinned, 1, {"slow (cpus 0)"}), std::nullopt);
  EXPECT_EQ(worker::plan_device_mismatch(pinned, 1, {"slow"}), std::nullopt);
  EXPECT_NE(worker::plan_device_mismatch(pinned, 1, {"fast (cpus 2,3)"}), std::nullopt);
  pinned.ranks[1].device = {"slow #1"};
  EXPECT_EQ(worker::plan_device_mismatch(pinned, 1, {"slow"}), std::nullopt);
  pinned.ranks[1].device = {};
  EXPECT_EQ(worker::plan_device_mismatch(pinned, 1, {"fast"}), std::nullopt);
  perfdb::Device unknown;
  unknown.name = "never profiled";
  unknown.backend = "cuda";
  const worker::PlanDevice none{{"never profiled"}, db_->upsert_device(unknown), 1 << 30,
                                [](int64_t) { return worker::Layout::kPlain; }};
  EXPECT_NE(error_message<std::runtime_error>([&] {
              worker::plan_split(graph_, {}, *db_, {fast_, none}, 24, {});
            }).find("device never profiled has no step measurements of this model"),
            std::string::npos);
}

// The joint split: under memory.policy auto a memory-limited device's batch
// above what fits without offload is a candidate at its plan's (measured)
// time, and the split uses it where that makes the whole step faster.
TEST_F(PlanningTest, AMemoryPlanLetsALimitedFastDeviceTakeMore) {
  worker::PlanDevice fast = fast_;
  fast.memory_bytes = 10u << 20;  // "none" peaks at b MiB: 4 and 8 fit
  auto record_auto = [&](const worker::PlanDevice& d, double factor, bool limited) {
    std::vector<perfdb::StepMeasurement> steps;
    for (int64_t b : {4, 8, 12, 16, 20, 24}) {
      perfdb::StepMeasurement s;
      s.model = worker::model_key(graph_, {});
      s.batch = b;
      s.memory_policy = "auto";
      s.policy_capacity_bytes = worker::step_policy_capacity(memory::Policy::kAuto, d.memory_bytes);
      s.workspace_plan = worker::kProfiledStepPlan;
      const bool offloads = limited && b > 8;
      s.time_ms = factor * (1.0 + 0.5 * b) * (offloads ? 1.2 : 1.0);
      s.peak_device_bytes = offloads ? d.memory_bytes : static_cast<uint64_t>(b) << 20;
      s.activations = common::ActivationBytes{static_cast<uint64_t>(b) << 19,
                                                  offloads ? uint64_t{3} << 20 : 0, 0};
      steps.push_back(s);
    }
    db_->record_step_measurements(d.id, steps);
  };
  record_auto(fast, 1.0, true);
  record_auto(slow_, 2.0, false);
  const std::vector<worker::PlanDevice> devices{fast, slow_};
  const balancer::BatchSplitOptions options{.granularity = 4};

  // Without a memory plan the fast device holds 8: 8 + 16 gives 5 and 18.
  const auto excluded = worker::plan_split(graph_, {}, *db_, devices, 24, options);
  EXPECT_EQ(excluded.batch, (std::vector<int64_t>{8, 16}));
  EXPECT_DOUBLE_EQ(excluded.step_time_ms, 18.0);
  // With it, 16 + 8: 9 x 1.2 = 10.8 and 10.
  const worker::StepPricing joint{{}, memory::Policy::kAuto};
  const auto split = worker::plan_split(graph_, {}, *db_, devices, 24, options, joint);
  EXPECT_EQ(split.batch, (std::vector<int64_t>{16, 8}));
  EXPECT_DOUBLE_EQ(split.step_time_ms, 10.8);

  const balancer::TrainingPlan plan = worker::plan_workspaces(graph_, {}, *db_, devices, split, joint);
  // The plan predicts what the split was chosen on, and says where each
  // rank's activations go at its batch.
  EXPECT_DOUBLE_EQ(plan.predicted_step_ms, 10.8);
  EXPECT_DOUBLE_EQ(plan.ranks[0].predicted_ms, 10.8);
  EXPECT_EQ(plan.ranks[0].activations, (common::ActivationBytes{8u << 20, 3u << 20, 0}));
  EXPECT_EQ(plan.ranks[1].activations, (common::ActivationBytes{4u << 20, 0, 0}));
  // Ideal: each device's best samples per ms, the fast one's at 8 (8 / 5,
  // above 8 offloading costs more than the batch gains), the slow one's at 24.
  ASSERT_TRUE(plan.ideal_step_ms);
  EXPECT_NEAR(*plan.ideal_step_ms, 24.0 / (8.0 / 5.0 + 24.0 / 26.0), 1e-9);
  const std::string text = worker::describe_plan(plan);
  EXPECT_NE(text.find("memory: activations kept 8.0 MiB, offloaded 3.0 MiB, recomputed 0.0 MiB"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("% of the ideal bound"), std::string::npos) << text;
}

// A workspace limit changes the kernels: the split is chosen on the
// limited kernels' times, and the plan predicts exactly that.
TEST_F(PlanningTest, TheSplitPricesTheWorkspacePlanAndThePlanPredictsIt) {
  const std::vector<worker::PlanDevice> devices{fast_, slow_};
  const worker::StepPricing limited{{balancer::WorkspacePolicy::kWr, 4096}, memory::Policy::kNone};
  const auto unlimited = worker::plan_split(graph_, {}, *db_, devices, 24, {.granularity = 4});
  const auto split = worker::plan_split(graph_, {}, *db_, devices, 24, {.granularity = 4}, limited);
  // Winograd within 4 KiB runs in calls of 4 at most: slower than undivided.
  EXPECT_GT(split.step_time_ms, unlimited.step_time_ms);
  const balancer::TrainingPlan plan = worker::plan_workspaces(graph_, {}, *db_, devices, split, limited);
  EXPECT_DOUBLE_EQ(plan.predicted_step_ms, split.step_time_ms);
  for (size_t r = 0; r < devices.size(); ++r) {
    EXPECT_DOUBLE_EQ(plan.ranks[r].predicted_ms, split.time_ms[r]);
  }
}

// A CPU's plan names its thread count (perfdb::device_label): a plan for
// one thread count is not followed on another, also when the cores the
// process is pinned to stand in the name, and the error says it is the
// thread count; a plan written before labels held the count is followed on
// any.
TEST(PlanDeviceMismatch, ThreadCountsCount) {
  balancer::TrainingPlan plan;
  plan.ranks.resize(1);
  plan.ranks[0].device = {"AMD EPYC", 2};
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"AMD EPYC", 2}), std::nullopt);
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"AMD EPYC", 1}),
            "rank 0 was planned for device 'AMD EPYC (2 threads)', but it runs on 'AMD EPYC (1 "
            "thread)': its thread count differs (device.threads; plan again for these devices)");
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"Intel Xeon", 2}),
            "rank 0 was planned for device 'AMD EPYC (2 threads)', but it runs on 'Intel Xeon (2 "
            "threads)' (plan again for these devices)");
  plan.ranks[0].device = {"AMD EPYC (cpus 0,1)", 2};
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"AMD EPYC (cpus 2,3)", 2}), std::nullopt);
  EXPECT_NE(worker::plan_device_mismatch(plan, 0, {"AMD EPYC (cpus 2,3)", 1}), std::nullopt);
  plan.ranks[0].device = {"AMD EPYC (cpus 0,1)", std::nullopt};  // an older plan
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"AMD EPYC (cpus 2)", 4}), std::nullopt);
  EXPECT_NE(worker::plan_device_mismatch(plan, 0, {"Intel Xeon", 4}), std::nullopt);
}

// A format-2 plan for a CPU (its thread count in the device text) is
// checked as format 3's fields are.
TEST(PlanDeviceMismatch, Version2PlansAreCheckedOnTheirThreadCount) {
  const balancer::TrainingPlan plan = balancer::parse_plan(
      "vtrain_plan: 2\nmodel: m\nglobal_batch: 2\nranks:\n"
      "  - {device: \"AMD EPYC (cpus 0,1) (2 threads)\", batch: 2}\n",
      "old.yaml");
  EXPECT_EQ(worker::plan_device_mismatch(plan, 0, {"AMD EPYC (cpus 2,3)", 2}), std::nullopt);
  EXPECT_CONTAINS(worker::plan_device_mismatch(plan, 0, {"AMD EPYC (cpus 0,1)", 4}).value_or(""),
                  "its thread count differs");
}

}  // namespace
}  // namespace vtrain
