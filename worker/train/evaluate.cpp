#include "worker/train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace vtrain::worker {
namespace {

// Whether class a ranks before class b (see the top of evaluate.h).
bool ranks_before(std::span<const float> scores, int64_t a, int64_t b) {
  return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
}

// The counts as doubles for one allreduce (integers below 2^53 add up
// exactly): top1, top5, per-class samples and top-1, the confusion matrix,
// then `losses`.
std::vector<double> flatten(const EvaluationCounts& c, const std::vector<double>& losses) {
  std::vector<double> v{static_cast<double>(c.top1), static_cast<double>(c.top5)};
  for (const std::vector<int64_t>* part : {&c.per_class_samples, &c.per_class_top1, &c.confusion}) {
    v.insert(v.end(), part->begin(), part->end());
  }
  v.insert(v.end(), losses.begin(), losses.end());
  return v;
}

// flatten's inverse for the counts; returns where the losses start.
size_t unflatten(const std::vector<double>& v, EvaluationCounts& c) {
  c.top1 = static_cast<int64_t>(v[0]);
  c.top5 = static_cast<int64_t>(v[1]);
  size_t at = 2;
  for (std::vector<int64_t>* part : {&c.per_class_samples, &c.per_class_top1, &c.confusion}) {
    for (int64_t& x : *part) x = static_cast<int64_t>(v[at++]);
  }
  return at;
}

}  // namespace

double EvaluationCounts::class_accuracy(int64_t c) const {
  const int64_t n = per_class_samples.at(static_cast<size_t>(c));
  if (n == 0) return -1.0;
  return static_cast<double>(per_class_top1[static_cast<size_t>(c)]) / static_cast<double>(n);
}

EvaluationCounts empty_counts(int64_t classes, bool confusion) {
  EvaluationCounts c;
  c.classes = classes;
  c.per_class_samples.assign(static_cast<size_t>(classes), 0);
  c.per_class_top1.assign(static_cast<size_t>(classes), 0);
  if (confusion) c.confusion.assign(static_cast<size_t>(classes * classes), 0);
  return c;
}

std::vector<int64_t> ranked_classes(std::span<const float> scores, int64_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  const auto first = static_cast<ptrdiff_t>(std::min<size_t>(static_cast<size_t>(std::max<int64_t>(k, 0)), order.size()));
  std::partial_sort(order.begin(), order.begin() + first, order.end(),
                    [&](int64_t a, int64_t b) { return ranks_before(scores, a, b); });
  order.resize(static_cast<size_t>(first));
  return order;
}

// The label's rank is the number of classes that rank before it.
bool in_top_k(std::span<const float> scores, int64_t label, int64_t k) {
  int64_t before = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(scores.size()); ++j) {
    before += ranks_before(scores, j, label) ? 1 : 0;
  }
  return before < k;
}

std::vector<double> softmax(std::span<const float> scores) {
  std::vector<double> p(scores.size());
  if (scores.empty()) return p;
  const double top = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (size_t j = 0; j < scores.size(); ++j) sum += p[j] = std::exp(static_cast<double>(scores[j]) - top);
  for (double& x : p) x /= sum;
  return p;
}

// log sum exp(z - max) - (z[label] - max), as CpuBackend::softmax_cross_entropy.
double sample_loss(std::span<const float> scores, int64_t label) {
  const double top = *std::max_element(scores.begin(), scores.end());
  double denom = 0;
  for (float z : scores) denom += std::exp(static_cast<double>(z) - top);
  return std::log(denom) - (static_cast<double>(scores[static_cast<size_t>(label)]) - top);
}

void count_batch(EvaluationCounts& counts, std::span<const float> logits,
                 std::span<const int32_t> labels, std::span<double> losses) {
  const int64_t k = counts.classes;
  if (static_cast<int64_t>(logits.size()) != static_cast<int64_t>(labels.size()) * k ||
      losses.size() != labels.size()) {
    throw std::invalid_argument("count_batch: " + std::to_string(logits.size()) + " scores and " +
                                std::to_string(losses.size()) + " losses for " +
                                std::to_string(labels.size()) + " samples of " +
                                std::to_string(k) + " classes");
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    const int64_t label = labels[i];
    if (label < 0 || label >= k) {
      throw std::invalid_argument("count_batch: label " + std::to_string(label) +
                                  " outside [0, " + std::to_string(k) + ")");
    }
    const std::span<const float> scores = logits.subspan(i * static_cast<size_t>(k), static_cast<size_t>(k));
    const int64_t first = ranked_classes(scores, 1).front();
    const auto l = static_cast<size_t>(label);
    ++counts.samples;
    ++counts.per_class_samples[l];
    if (first == label) {
      ++counts.top1;
      ++counts.per_class_top1[l];
    }
    counts.top5 += in_top_k(scores, label, kTopK) ? 1 : 0;
    if (!counts.confusion.empty()) ++counts.confusion[l * static_cast<size_t>(k) + static_cast<size_t>(first)];
    losses[i] = sample_loss(scores, label);
  }
}

std::pair<int64_t, int64_t> evaluation_share(int64_t count, int64_t unit, int rank, int ranks) {
  const int64_t units = (count + unit - 1) / unit;
  const int64_t first = units * rank / ranks, last = units * (rank + 1) / ranks;
  return {std::min(first * unit, count), std::min(last * unit, count)};
}

EvaluationCounts evaluate(Network& net, const Dataset& data, const ChannelStats& norm,
                          Staging& stage, const EvaluationOptions& options) {
  const int64_t classes = net.graph().classes();
  EvaluationCounts counts = empty_counts(classes, options.confusion);
  if (data.count == 0) return counts;
  Communicator* const comm = options.comm;
  const auto [first, last] = evaluation_share(data.count, options.share_unit,
                                              comm ? comm->rank() : 0, comm ? comm->size() : 1);
  // Every sample's loss at its place, zero on the ranks that did not score
  // it: the allreduce adds each to zeros, exactly.
  std::vector<double> losses(static_cast<size_t>(data.count), 0.0);
  std::vector<float> logits;
  for (int64_t at = first; at < last; at += options.chunk) {
    const int64_t n = std::min(options.chunk, last - at);
    stage.indices.resize(static_cast<size_t>(n));
    std::iota(stage.indices.begin(), stage.indices.end(), at);
    gather_staged(data, norm, stage, 0, options.pool);
    upload_staged(net, stage);
    logits.resize(static_cast<size_t>(n * classes));
    net.evaluate(n, logits.data());
    count_batch(counts, logits, stage.labels,
                std::span<double>(losses).subspan(static_cast<size_t>(at), static_cast<size_t>(n)));
  }
  if (comm) {
    std::vector<double> sums = flatten(counts, losses);
    comm->allreduce_sum(sums);
    losses.assign(sums.begin() + static_cast<ptrdiff_t>(unflatten(sums, counts)), sums.end());
  }
  counts.samples = data.count;
  counts.loss_sum = std::accumulate(losses.begin(), losses.end(), 0.0);
  return counts;
}

}  // namespace vtrain::worker
