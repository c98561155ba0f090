// Every rank's DeviceInfo, exchanged as one text per rank. The encoding
// prefixes each field with its length, so any name (a GPU name holding '|',
// a CPU model such as "AMD EPYC (cpus 0,1)") comes back exactly.
#pragma once

#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/device/backend.h"

namespace vtrain::worker {

// "4:cuda9:Tesla K80..." : every field as LENGTH:BYTES, in declaration order.
std::string encode_device_info(const DeviceInfo& info);

// The inverse of encode_device_info. Throws std::invalid_argument naming the
// field that is missing or malformed, and where in `text`.
DeviceInfo decode_device_info(const std::string& text);

// Every rank's `mine`, in rank order, on every rank. Collective.
std::vector<DeviceInfo> gather_device_infos(Communicator& comm, const DeviceInfo& mine);

}  // namespace vtrain::worker
