#include "worker/comm/device_infos.h"

namespace vtrain::worker {

void WireFormat<DeviceInfo>::write(WireWriter& out, const DeviceInfo& info) {
  out.text(info.backend);
  out.text(info.name);
  out.number(info.memory_bytes);
  out.number(info.threads);
  out.text(info.library_version);
  out.text(info.host);
  out.text(info.device_key);
  out.numbers(info.cpus);
}

DeviceInfo WireFormat<DeviceInfo>::read(WireReader& in) {
  DeviceInfo info;
  info.backend = in.text("backend");
  info.name = in.text("name");
  info.memory_bytes = in.number<size_t>("memory_bytes");
  info.threads = in.number<int>("threads");
  info.library_version = in.text("library_version");
  info.host = in.text("host");
  info.device_key = in.text("device_key");
  info.cpus = in.numbers<int>("cpus", "cpu");
  return info;
}

void WireFormat<common::Precision>::write(WireWriter& out, common::Precision precision) {
  out.name(common::kPrecisionNames, precision);
}

common::Precision WireFormat<common::Precision>::read(WireReader& in) {
  return in.named("precision", common::kPrecisionNames);
}

std::string encode_device_info(const DeviceInfo& info) { return encode_message(info); }

DeviceInfo decode_device_info(const std::string& text) { return decode_message<DeviceInfo>(text); }

std::vector<DeviceInfo> gather_device_infos(Communicator& comm, const DeviceInfo& mine) {
  return all_gather_messages(comm, mine);
}

std::vector<common::Precision> gather_precisions(Communicator& comm, common::Precision mine) {
  return all_gather_messages(comm, mine);
}

}  // namespace vtrain::worker
