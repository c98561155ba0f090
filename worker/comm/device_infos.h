// Every rank's DeviceInfo and precision, exchanged as typed messages
// (worker/comm/wire.h): any name (a GPU name holding '|', a CPU model such
// as "AMD EPYC (cpus 0,1)") comes back exactly, a precision as its name.
#pragma once

#include <string>
#include <vector>

#include "common/precision.h"
#include "worker/comm/communicator.h"
#include "worker/comm/wire.h"
#include "worker/device/backend.h"

namespace vtrain::worker {

// Every field in declaration order, the cpus as one list.
template <>
struct WireFormat<DeviceInfo> {
  static constexpr const char* kName = "device info";
  static void write(WireWriter& out, const DeviceInfo& info);
  static DeviceInfo read(WireReader& in);
};

// A rank's train.precision, as its name (common::kPrecisionNames).
template <>
struct WireFormat<common::Precision> {
  static constexpr const char* kName = "precision";
  static void write(WireWriter& out, common::Precision precision);
  static common::Precision read(WireReader& in);
};

// encode_message / decode_message of a DeviceInfo. decode throws WireError
// (a std::invalid_argument) naming the field that is missing or malformed.
std::string encode_device_info(const DeviceInfo& info);
DeviceInfo decode_device_info(const std::string& text);

// Every rank's `mine`, in rank order, on every rank. Collective.
std::vector<DeviceInfo> gather_device_infos(Communicator& comm, const DeviceInfo& mine);

// Every rank's precision `mine`, in rank order, on every rank. Collective.
std::vector<common::Precision> gather_precisions(Communicator& comm, common::Precision mine);

}  // namespace vtrain::worker
