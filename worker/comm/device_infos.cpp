#include "worker/comm/device_infos.h"

#include <charconv>
#include <stdexcept>
#include <string_view>

namespace vtrain::worker {
namespace {

void put(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

// Reads LENGTH:BYTES at `at` and moves past it.
class Reader {
 public:
  explicit Reader(std::string_view text) : text_(text) {}

  std::string field(const char* name) {
    const size_t colon = text_.find(':', at_);
    size_t length = 0;
    const char* first = text_.data() + at_;
    const char* last = colon == std::string_view::npos ? first : text_.data() + colon;
    const auto [end, ec] = std::from_chars(first, last, length);
    if (colon == std::string_view::npos || ec != std::errc() || end != last || first == last ||
        length > text_.size() - colon - 1) {
      throw std::invalid_argument("device info: field " + std::string(name) + " at offset " +
                                  std::to_string(at_) + ": expected LENGTH:BYTES within the " +
                                  std::to_string(text_.size()) + " bytes of the text");
    }
    at_ = colon + 1 + length;
    return std::string(text_.substr(colon + 1, length));
  }

  template <class Int>
  Int number(const char* name) {
    const std::string digits = field(name);
    Int value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
      throw std::invalid_argument("device info: field " + std::string(name) +
                                  ": expected a number, got '" + digits + "'");
    }
    return value;
  }

  bool at_end() const { return at_ == text_.size(); }

  void expect_end() const {
    if (at_ != text_.size()) {
      throw std::invalid_argument("device info: " + std::to_string(text_.size() - at_) +
                                  " bytes left after the last field");
    }
  }

 private:
  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace

std::string encode_device_info(const DeviceInfo& info) {
  std::string out;
  put(out, info.backend);
  put(out, info.name);
  put(out, std::to_string(info.memory_bytes));
  put(out, std::to_string(info.threads));
  put(out, info.library_version);
  put(out, info.host);
  put(out, info.device_key);
  std::string cpus;
  for (int c : info.cpus) put(cpus, std::to_string(c));
  put(out, cpus);
  return out;
}

DeviceInfo decode_device_info(const std::string& text) {
  Reader in(text);
  DeviceInfo info;
  info.backend = in.field("backend");
  info.name = in.field("name");
  info.memory_bytes = in.number<size_t>("memory_bytes");
  info.threads = in.number<int>("threads");
  info.library_version = in.field("library_version");
  info.host = in.field("host");
  info.device_key = in.field("device_key");
  const std::string cpu_list = in.field("cpus");  // LENGTH:NUMBER for each CPU
  Reader cpus(cpu_list);
  while (!cpus.at_end()) info.cpus.push_back(cpus.number<int>("cpu"));
  in.expect_end();
  return info;
}

std::vector<DeviceInfo> gather_device_infos(Communicator& comm, const DeviceInfo& mine) {
  std::string all;
  for (const std::string& one : comm.gather(encode_device_info(mine), 0)) put(all, one);
  comm.broadcast(all, 0);
  std::vector<DeviceInfo> infos;
  Reader in(all);
  for (int r = 0; r < comm.size(); ++r) {
    infos.push_back(decode_device_info(in.field(("rank " + std::to_string(r)).c_str())));
  }
  in.expect_end();
  return infos;
}

}  // namespace vtrain::worker
