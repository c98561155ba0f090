// Evaluation's counts (worker/train/evaluate.h): top-1 and top-5 against a
// brute-force count and a hand computation, ties, fewer classes than 5, the
// ranks' shares, and evaluate() on a tiny fully connected network with known
// weights against logits computed here, alone and as the sum of several
// ranks' parts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "worker/device/backend.h"
#include "worker/device/pinned_memory.h"
#include "worker/engine/graph.h"
#include "worker/engine/network.h"
#include "worker/train/batch_gatherer.h"
#include "worker/train/evaluate.h"

namespace vtrain::worker {
namespace {

// A class ranking written the slow way: every class sorted by score,
// highest first, a tie to the lower index.
std::vector<int64_t> full_ranking(std::span<const float> scores) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  return order;
}

// The counts by brute force: each sample's position of its label in the
// full ranking.
EvaluationCounts brute_force(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                             int64_t classes) {
  EvaluationCounts c = empty_counts(classes, true);
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::span<const float> z(logits.data() + i * classes, static_cast<size_t>(classes));
    const std::vector<int64_t> order = full_ranking(z);
    const auto rank = std::find(order.begin(), order.end(), labels[i]) - order.begin();
    ++c.samples;
    ++c.per_class_samples[labels[i]];
    c.top1 += rank == 0;
    c.per_class_top1[labels[i]] += rank == 0;
    c.top5 += rank < 5;
    ++c.confusion[labels[i] * classes + order[0]];
    double denom = 0;
    for (float v : z) denom += std::exp(static_cast<double>(v));
    c.loss_sum += std::log(denom) - z[labels[i]];
  }
  return c;
}

void expect_same_counts(const EvaluationCounts& a, const EvaluationCounts& b) {
  EXPECT_EQ(a.samples, b.samples);
  EXPECT_EQ(a.top1, b.top1);
  EXPECT_EQ(a.top5, b.top5);
  EXPECT_EQ(a.per_class_samples, b.per_class_samples);
  EXPECT_EQ(a.per_class_top1, b.per_class_top1);
  EXPECT_EQ(a.confusion, b.confusion);
}

// count_batch's losses added up, into loss_sum.
EvaluationCounts counted(const std::vector<float>& logits, const std::vector<int32_t>& labels,
                         int64_t classes) {
  EvaluationCounts c = empty_counts(classes, true);
  std::vector<double> losses(labels.size());
  count_batch(c, logits, labels, losses);
  c.loss_sum = std::accumulate(losses.begin(), losses.end(), 0.0);
  return c;
}

TEST(EvaluateCounts, MatchABruteForceCountOnRandomScoresWithTies) {
  for (const int64_t classes : {1, 2, 3, 5, 6, 10, 37}) {
    SCOPED_TRACE(classes);
    std::mt19937 rng(static_cast<unsigned>(classes));
    // Scores from a few values only, so that many samples have ties.
    std::uniform_int_distribution<int> level(0, 3);
    std::uniform_int_distribution<int32_t> label(0, static_cast<int32_t>(classes - 1));
    const int64_t n = 300;
    std::vector<float> logits(static_cast<size_t>(n * classes));
    for (float& v : logits) v = 0.5f * static_cast<float>(level(rng));
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (int32_t& l : labels) l = label(rng);
    const EvaluationCounts fast = counted(logits, labels, classes);
    const EvaluationCounts slow = brute_force(logits, labels, classes);
    expect_same_counts(fast, slow);
    EXPECT_NEAR(fast.loss_sum, slow.loss_sum, 1e-9 * slow.loss_sum + 1e-12);
    if (classes <= kTopK) EXPECT_EQ(fast.top5, n) << "top-5 of 5 classes or fewer is every sample";
  }
}

// Seven classes, scores by hand: the ranking of the first sample is
// 4, 1, 6, 0, 3, 5, 2 (0 and 3 tie at 0.3: 0 first).
TEST(EvaluateCounts, TopFiveByHand) {
  const std::vector<float> z = {0.3f, 0.8f, -1.0f, 0.3f, 2.0f, 0.1f, 0.5f};
  EXPECT_EQ(ranked_classes(z, 7), (std::vector<int64_t>{4, 1, 6, 0, 3, 5, 2}));
  EXPECT_EQ(ranked_classes(z, 5), (std::vector<int64_t>{4, 1, 6, 0, 3}));
  EXPECT_EQ(ranked_classes(z, 9).size(), 7u);
  // Label 3 is fifth: in the top 5; label 5 is sixth, label 2 last: not.
  EXPECT_TRUE(in_top_k(z, 3, 5));
  EXPECT_FALSE(in_top_k(z, 5, 5));
  EXPECT_FALSE(in_top_k(z, 2, 5));
  EXPECT_TRUE(in_top_k(z, 4, 1));
  EXPECT_FALSE(in_top_k(z, 1, 1));
  std::vector<float> logits;
  for (int s = 0; s < 4; ++s) logits.insert(logits.end(), z.begin(), z.end());
  const EvaluationCounts c = counted(logits, {3, 5, 2, 4}, 7);
  EXPECT_EQ(c.top1, 1);  // label 4
  EXPECT_EQ(c.top5, 2);  // labels 3 and 4
  EXPECT_DOUBLE_EQ(c.top5_accuracy(), 0.5);
  EXPECT_DOUBLE_EQ(c.accuracy(), 0.25);
  EXPECT_EQ(c.confusion[3 * 7 + 4], 1);  // every sample's first class is 4
  EXPECT_EQ(c.confusion[4 * 7 + 4], 1);
  EXPECT_DOUBLE_EQ(c.class_accuracy(4), 1.0);
  EXPECT_DOUBLE_EQ(c.class_accuracy(3), 0.0);
  EXPECT_LT(c.class_accuracy(0), 0) << "a class without samples has no accuracy";
}

TEST(EvaluateCounts, SoftmaxSumsToOneAndFollowsTheRanking) {
  const std::vector<float> z = {1000.0f, 999.0f, -5.0f, 0.0f};  // large: no overflow
  const std::vector<double> p = softmax(z);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
  EXPECT_NEAR(p[0] / p[1], std::exp(1.0), 1e-9);
  EXPECT_NEAR(sample_loss(z, 1), -std::log(p[1]), 1e-9);
}

TEST(EvaluateCounts, BadSizesAndLabelsAreRefused) {
  EvaluationCounts c = empty_counts(3, false);
  std::vector<double> losses(2);
  EXPECT_THROW(count_batch(c, std::vector<float>(5), std::vector<int32_t>{0, 1}, losses),
               std::invalid_argument);
  EXPECT_THROW(count_batch(c, std::vector<float>(6), std::vector<int32_t>{0, 3}, losses),
               std::invalid_argument);
}

// Every sample in exactly one share, shares in rank order, whole units.
TEST(EvaluateShares, CoverTheDataOnceInWholeUnits) {
  for (const int64_t count : {0, 1, 7, 64, 65, 512}) {
    for (const int64_t unit : {1, 8, 64, 100}) {
      for (int ranks = 1; ranks <= 5; ++ranks) {
        int64_t next = 0;
        for (int r = 0; r < ranks; ++r) {
          const auto [first, last] = evaluation_share(count, unit, r, ranks);
          EXPECT_EQ(first, next) << count << " " << unit << " " << r << "/" << ranks;
          EXPECT_LE(first, last);
          EXPECT_TRUE(first % unit == 0 || first == count);
          next = last;
        }
        EXPECT_EQ(next, count);
      }
    }
  }
}

// A communicator for one rank at a time: allreduce_sum records what this
// rank put in and adds what the other ranks put in (`others`, recorded
// before).
class RecordingComm final : public Communicator {
 public:
  RecordingComm(int rank, int ranks, std::vector<double> others = {})
      : rank_(rank), ranks_(ranks), others_(std::move(others)) {}
  int rank() const override { return rank_; }
  int size() const override { return ranks_; }
  void allreduce_async(void*, int64_t, common::DataType) override {}
  void wait() override {}
  double allreduce_seconds() const override { return 0; }
  double wait_seconds() const override { return 0; }
  void allreduce_sum(std::vector<double>& values) override {
    mine = values;
    for (size_t i = 0; i < others_.size(); ++i) values.at(i) += others_[i];
  }
  void broadcast(std::vector<float>&, int) override {}
  void broadcast(std::string&, int) override {}
  std::vector<std::string> gather(const std::string& text, int) override { return {text}; }
  void barrier() override {}
  [[noreturn]] void abort(int) override { throw std::runtime_error("abort"); }
  std::vector<double> mine;

 private:
  int rank_, ranks_;
  std::vector<double> others_;
};

// input (1x2x2) -> fc with `classes` outputs, weights and biases from a seed.
class TinyNetwork : public ::testing::Test {
 protected:
  static constexpr int64_t kClasses = 7;
  void SetUp() override {
    backend_ = make_backend({.kind = worker::BackendKind::kCpu, .threads = 1});
    LayerSpec in, fc;
    in.name = "data";
    fc.name = "fc";
    fc.type = LayerType::kFc;
    fc.inputs = {"data"};
    fc.out = kClasses;
    graph_ = std::make_unique<Graph>(Graph::build({in, fc}, Shape{1, 1, 2, 2}));
    data_ = make_synthetic(Shape{1, 1, 2, 2}, kClasses, 53, 5);
    norm_ = channel_stats(data_);
    std::mt19937 rng(9);
    std::normal_distribution<float> value(0.0f, 1.0f);
    params_.resize(static_cast<size_t>(kClasses * 4 + kClasses));  // weights, then biases
    for (float& p : params_) p = value(rng);
  }

  std::unique_ptr<Network> network(int64_t max_batch) {
    NetworkOptions o;
    o.max_batch = max_batch;
    auto net = std::make_unique<Network>(*graph_, *backend_, o);
    net->upload_parameters(params_);
    return net;
  }

  // The logits W x + b of every sample, x normalised as evaluation does.
  std::vector<float> host_logits() const {
    std::vector<int64_t> all(static_cast<size_t>(data_.count));
    std::iota(all.begin(), all.end(), int64_t{0});
    std::vector<float> x(static_cast<size_t>(data_.count * 4));
    std::vector<int32_t> labels(static_cast<size_t>(data_.count));
    gather_batch(data_, all, norm_, x.data(), labels.data());
    std::vector<float> z(static_cast<size_t>(data_.count * kClasses));
    for (int64_t i = 0; i < data_.count; ++i) {
      for (int64_t k = 0; k < kClasses; ++k) {
        double s = params_[static_cast<size_t>(kClasses * 4 + k)];
        for (int64_t j = 0; j < 4; ++j) s += static_cast<double>(params_[k * 4 + j]) * x[i * 4 + j];
        z[static_cast<size_t>(i * kClasses + k)] = static_cast<float>(s);
      }
    }
    return z;
  }

  EvaluationCounts run(Network& net, const EvaluationOptions& options) {
    PinnedMemory pinned(*backend_);
    Staging stage(&pinned);
    return evaluate(net, data_, norm_, stage, options);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Graph> graph_;
  Dataset data_;
  ChannelStats norm_;
  std::vector<float> params_;
};

TEST_F(TinyNetwork, EvaluateCountsWhatTheKnownWeightsScore) {
  const EvaluationCounts slow = brute_force(host_logits(), data_.labels, kClasses);
  ASSERT_GT(slow.top5, slow.top1) << "a test of top-5 needs samples between top-1 and top-5";
  ASSERT_LT(slow.top5, slow.samples);
  auto net = network(8);
  const EvaluationCounts e = run(*net, {.chunk = 8, .confusion = true});
  expect_same_counts(e, slow);
  EXPECT_NEAR(e.loss_sum, slow.loss_sum, 1e-5 * slow.loss_sum);
}

// Three ranks' parts, each recorded on its own and added up, give what
// one process counts, to the last bit.
TEST_F(TinyNetwork, RanksPartsAddUpToTheWholeExactly) {
  auto net = network(8);
  const EvaluationCounts whole = run(*net, {.chunk = 8, .share_unit = 8, .confusion = true});
  constexpr int kRanks = 3;
  std::vector<double> others;
  for (int r = 1; r < kRanks; ++r) {
    RecordingComm comm(r, kRanks);
    run(*net, {.chunk = 8, .share_unit = 8, .confusion = true, .comm = &comm});
    others.resize(comm.mine.size());
    for (size_t i = 0; i < others.size(); ++i) others[i] += comm.mine[i];
  }
  RecordingComm rank0(0, kRanks, others);
  const EvaluationCounts joined =
      run(*net, {.chunk = 8, .share_unit = 8, .confusion = true, .comm = &rank0});
  expect_same_counts(joined, whole);
  EXPECT_EQ(joined.loss_sum, whole.loss_sum);
}

}  // namespace
}  // namespace vtrain::worker
