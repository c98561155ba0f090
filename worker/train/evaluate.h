// Scoring a network on a labelled dataset: the test loss, top-1 and top-5
// accuracy, per-class accuracy and the confusion matrix, with the dataset
// divided among the ranks of a job and the counts added up. The trainer's
// evaluation after every epoch and `vtrain evaluate` both run evaluate();
// `vtrain predict` ranks one sample's classes with ranked_classes() and
// softmax().
//
// Ranking: a sample's classes are ordered by score, highest first, a tie
// going to the lower class index (so top-1 is the backend's arg-max, which
// keeps the first maximum). Top-k counts a sample whose label is among its k
// first classes: with k or fewer classes, every sample.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/data/data.h"
#include "worker/engine/network.h"
#include "worker/train/batch_gatherer.h"

namespace vtrain::worker {

// The k of top-k accuracy in evaluations and metrics.
inline constexpr int kTopK = 5;

// What scoring `samples` samples of a `classes`-class model counted.
struct EvaluationCounts {
  int64_t classes = 0;
  int64_t samples = 0;
  double loss_sum = 0;  // sum over samples of -log softmax(scores)[label]
  int64_t top1 = 0;     // samples whose first class is their label
  int64_t top5 = 0;     // samples whose label is among their kTopK first classes
  std::vector<int64_t> per_class_samples;  // per label: samples with it
  std::vector<int64_t> per_class_top1;     // per label: of those, top-1 right
  // With EvaluationOptions::confusion: classes x classes, entry
  // [label * classes + first class]; empty otherwise.
  std::vector<int64_t> confusion;

  double loss() const { return samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0; }
  double accuracy() const { return fraction(top1); }
  double top5_accuracy() const { return fraction(top5); }
  // Class c's top-1 accuracy; -1 when the data has no sample of class c.
  double class_accuracy(int64_t c) const;

 private:
  double fraction(int64_t count) const {
    return samples > 0 ? static_cast<double>(count) / static_cast<double>(samples) : 0.0;
  }
};

// Counts for `classes` classes, nothing scored yet (with a confusion
// matrix when `confusion`).
EvaluationCounts empty_counts(int64_t classes, bool confusion);

// The first k classes of one sample's `scores` (fewer when there are
// fewer classes), in rank order (see the top of this file).
std::vector<int64_t> ranked_classes(std::span<const float> scores, int64_t k);
// Whether `label` is among the first k classes of `scores`.
bool in_top_k(std::span<const float> scores, int64_t label, int64_t k);
// softmax(scores), in double: probabilities that sum to 1.
std::vector<double> softmax(std::span<const float> scores);
// -log softmax(scores)[label], computed as the backends' loss is.
double sample_loss(std::span<const float> scores, int64_t label);

// Adds the samples of one batch to `counts`: `logits` holds labels.size()
// rows of counts.classes scores. Each sample's loss goes to `losses` (one
// per sample, in order) rather than into loss_sum, which the caller adds
// up in an order of its choosing. Throws std::invalid_argument for sizes
// that do not match or a label outside [0, classes).
void count_batch(EvaluationCounts& counts, std::span<const float> logits,
                 std::span<const int32_t> labels, std::span<double> losses);

// Samples [first, last) of `count` that rank `rank` of `ranks` scores: a
// contiguous share of whole units of `unit` samples (the last unit may be
// shorter), the units divided as evenly as they go, in rank order. A rank
// may get none.
std::pair<int64_t, int64_t> evaluation_share(int64_t count, int64_t unit, int rank, int ranks);

struct EvaluationOptions {
  int64_t chunk = 64;      // samples per forward pass (at most the network's max_batch)
  // Ranks' shares are whole units of this many samples. The chunk on every
  // rank makes every forward pass the same batch of samples whatever the
  // rank count (`vtrain evaluate`); 1 splits samples evenly (the trainer,
  // whose ranks' chunks differ).
  int64_t share_unit = 1;
  bool confusion = false;  // fill EvaluationCounts::confusion
  // The job's ranks (collective: every rank calls evaluate with the same
  // data and units); null: this process scores everything.
  Communicator* comm = nullptr;
  // Decodes samples that need more than a copy (image files, transforms)
  // on its threads; null: the calling thread does.
  DecodePool* pool = nullptr;
};

// Scores `net` (in inference mode: batch norm with its running statistics)
// on this rank's share of `data`, normalised by `norm`, gathering batches
// in `stage`, and returns the whole dataset's counts on every rank. The
// loss is the sum of the per-sample losses in sample order, so that it,
// like the counts, does not depend on how the samples were divided among
// the ranks. Throws what the network throws.
EvaluationCounts evaluate(Network& net, const Dataset& data, const ChannelStats& norm,
                          Staging& stage, const EvaluationOptions& options);

}  // namespace vtrain::worker
