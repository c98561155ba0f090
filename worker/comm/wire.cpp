#include "worker/comm/wire.h"

namespace vtrain::worker {

void WireWriter::text(std::string_view bytes) {
  out_ += std::to_string(bytes.size());
  out_ += ':';
  out_ += bytes;
}

void WireWriter::real(double value) {
  char digits[32];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  (void)ec;  // 32 characters hold any double's shortest form
  text(std::string_view(digits, static_cast<size_t>(end - digits)));
}

std::string WireReader::text(std::string_view field) {
  const size_t colon = bytes_.find(':', at_);
  size_t length = 0;
  const char* first = bytes_.data() + at_;
  const char* last = colon == std::string_view::npos ? first : bytes_.data() + colon;
  const auto [end, ec] = std::from_chars(first, last, length);
  if (colon == std::string_view::npos || ec != std::errc() || end != last || first == last ||
      length > bytes_.size() - colon - 1) {
    throw WireError(message_ + ": field " + std::string(field) + " at offset " +
                    std::to_string(at_) + ": expected LENGTH:BYTES within the " +
                    std::to_string(bytes_.size()) + " bytes of the message");
  }
  at_ = colon + 1 + length;
  return std::string(bytes_.substr(colon + 1, length));
}

bool WireReader::flag(std::string_view field) {
  const std::string digit = text(field);
  if (digit != "0" && digit != "1") not_a(field, "flag (0 or 1)", digit);
  return digit == "1";
}

void WireReader::expect_end() const {
  if (at_ != bytes_.size()) {
    throw WireError(message_ + ": " + std::to_string(bytes_.size() - at_) +
                    " bytes left after the last field");
  }
}

void WireReader::not_a(std::string_view field, const char* kind, const std::string& got) const {
  throw WireError(message_ + ": field " + std::string(field) + ": expected a " + kind +
                  ", got '" + got + "'");
}

void WireReader::not_one_of(std::string_view field, const std::vector<std::string>& known,
                            const std::string& got) const {
  throw WireError(message_ + ": field " + std::string(field) + ": expected one of " +
                  common::join(known, ", ") + ", got '" + got + "'");
}

std::vector<std::string> all_gather_texts(Communicator& comm, const std::string& text) {
  WireWriter all;
  for (const std::string& one : comm.gather(text, 0)) all.text(one);
  std::string bytes = all.bytes();
  comm.broadcast(bytes, 0);
  WireReader in(bytes, "every rank's message");
  std::vector<std::string> texts;
  for (int r = 0; r < comm.size(); ++r) texts.push_back(in.text("rank " + std::to_string(r)));
  in.expect_end();
  return texts;
}

}  // namespace vtrain::worker
