// What delivers a rank's training batches, as the batch split sees it: a
// rate in images/s (the split takes a rank's step at batch b as
// max(compute(b), b / rate): batches are made ahead of the step that takes
// them). The profiler measures a rank's rate through this interface once
// per perf DB key (host, workers, dataset, input shape, transform) and
// stores it there; the batch split reads it back.
//
// Implementation: worker::GatherRateSource (worker/train/input_rate.h),
// which makes batches as training does: on a decoding pool of the rank's
// data.workers through the training transform where the samples need one,
// else on one thread.
#pragma once

#include <cstdint>
#include <string>

namespace vtrain::common {

class InputRateSource {
 public:
  virtual ~InputRateSource() = default;

  // Decoding workers (threads) that make the batches, >= 1. Part of the
  // rate's key: a rate measured with other workers is measured again.
  virtual int workers() const = 0;
  // The training transform's signature, not empty ("normalise" for data
  // held in memory; a pool's e.g. "rrc224+flip+normalise"). Part of the key.
  virtual std::string transform() const = 0;
  // Makes `batches` batches of `batch` training samples as training would,
  // each as fast as the source can, and returns the images/s they came at
  // (> 0; the median over the batches). Takes as long as that many batches
  // take; throws what making a batch throws (e.g. a data error).
  virtual double measure_images_per_second(int64_t batch, int batches) = 0;
};

}  // namespace vtrain::common
