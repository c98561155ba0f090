// train.precision resolved on each rank's device: one precision for every
// rank, `auto` (the first of train.precisions the device offers), a list of
// one per rank, or a map from device names (devices it does not name
// choose as auto does). A device asked for a precision it lacks is a
// ConfigError naming the key, the device and what it offers; `vtrain check`
// and training make the same check.
#pragma once

#include <string>
#include <vector>

#include "common/precision.h"
#include "configs/config.h"
#include "worker/device/backend.h"

namespace vtrain::config {

// The precisions `backend` trains in, in kPrecisionNames order.
std::vector<common::Precision> offered_precisions(const worker::Backend& backend);

// "AMD EPYC (cpu) offers fp32" for the error messages.
std::string offers_text(const worker::Backend& backend);

// Whether train.precision's map key `name` names the device `device`: the
// same name, or the name with a suffix in parentheses (a CPU slice's
// " (cpus 0,1)", the test emulation's suffix).
bool names_device(const std::string& name, const std::string& device);

// The precision rank `rank` of `ranks` trains in on `backend`. Throws
// ConfigError at train.precision (or its entry) for a precision the device
// lacks, for a list whose length is not `ranks`, or at train.precisions
// when auto finds none of them on the device.
common::Precision rank_precision(const Config& config, int rank, int ranks,
                                 const worker::Backend& backend);

// `vtrain check` on one machine for a job of `ranks` ranks: every entry
// of a per-rank list and of the map must be offered by this machine's
// device, as training would find; returns rank 0's precision.
common::Precision check_precisions(const Config& config, int ranks,
                                   const worker::Backend& backend);

// A copy of `config` with train.precision set to `precision` (a rank's,
// resolved); train.precision_choice is kept as written.
Config with_rank_precision(Config config, common::Precision precision);

}  // namespace vtrain::config
