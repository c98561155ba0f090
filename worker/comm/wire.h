// Typed messages between ranks. Each message type T has one encode/decode
// pair, a specialisation of WireFormat<T> (its name for errors, how it is
// written and read), over one field codec: every field is LENGTH:BYTES in
// the order written, numbers in decimal, so that any bytes of a name come
// back exactly, and a short or malformed message is an error naming the
// message and the field, never a wrong value. The collectives at the end
// carry any such type.
#pragma once

#include <charconv>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/name_table.h"
#include "worker/comm/communicator.h"

namespace vtrain::worker {

// A received message does not decode. The text starts with the message's
// name (WireFormat<T>::kName) and names the field.
class WireError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Builds one message, field after field.
class WireWriter {
 public:
  void text(std::string_view bytes);
  template <std::integral Int>
    requires(!std::same_as<Int, bool>)
  void number(Int value) {
    text(std::to_string(value));
  }
  void real(double value);  // exactly: the shortest text that reads back to `value`
  void flag(bool value) { text(value ? "1" : "0"); }
  // An enum as its name in `table` (common/name_table.h).
  template <class E, size_t N>
  void name(const std::array<common::Named<E>, N>& table, E value) {
    text(common::name_of(table, value));
  }
  // The whole list as one field of LENGTH:NUMBER entries.
  template <std::integral Int>
  void numbers(const std::vector<Int>& values) {
    WireWriter list;
    for (Int v : values) list.number(v);
    text(list.bytes());
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

// Reads one message's fields in the order they were written. Every read
// names its field; a field that is missing, cut short or not of its type
// throws WireError("<message>: field <name> ...").
class WireReader {
 public:
  // Views `bytes`, which must outlive the reader; a temporary string is
  // refused at compile time.
  WireReader(std::string_view bytes, std::string message)
      : bytes_(bytes), message_(std::move(message)) {}
  WireReader(std::string&& bytes, std::string message) = delete;

  std::string text(std::string_view field);
  template <std::integral Int>
    requires(!std::same_as<Int, bool>)
  Int number(std::string_view field) {
    return parsed<Int>(field, "number");
  }
  double real(std::string_view field) { return parsed<double>(field, "real number"); }
  bool flag(std::string_view field);
  // A field written by WireWriter::name: a name in `table`; any other text
  // throws WireError listing the known names.
  template <class E, size_t N>
  E named(std::string_view field, const std::array<common::Named<E>, N>& table) {
    const std::string got = text(field);
    if (const std::optional<E> value = common::find_named(table, got)) return *value;
    not_one_of(field, common::names_of(table), got);
  }
  // A field written by WireWriter::numbers; `each` names its entries.
  template <std::integral Int>
  std::vector<Int> numbers(std::string_view field, std::string_view each) {
    const std::string items = text(field);  // outlives the reader that views it
    WireReader list(items, message_);
    std::vector<Int> values;
    while (!list.at_end()) values.push_back(list.number<Int>(each));
    return values;
  }

  bool at_end() const { return at_ == bytes_.size(); }
  // Throws WireError when bytes are left after the last field read.
  void expect_end() const;

 private:
  // The field as a `kind` (what std::from_chars reads as a Value), all of it.
  template <typename Value>
  Value parsed(std::string_view field, const char* kind) {
    const std::string digits = text(field);
    Value value{};
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
      not_a(field, kind, digits);
    }
    return value;
  }
  [[noreturn]] void not_a(std::string_view field, const char* kind, const std::string& got) const;
  [[noreturn]] void not_one_of(std::string_view field, const std::vector<std::string>& known,
                               const std::string& got) const;

  std::string_view bytes_;
  std::string message_;
  size_t at_ = 0;
};

// Specialise for each message type:
//   template <> struct WireFormat<T> {
//     static constexpr const char* kName = "...";  // for errors
//     static void write(WireWriter& out, const T& value);
//     static T read(WireReader& in);
//   };
template <typename T>
struct WireFormat;

template <typename T>
std::string encode_message(const T& value) {
  WireWriter out;
  WireFormat<T>::write(out, value);
  return out.bytes();
}

// The inverse of encode_message: every field, and nothing after the last.
// Throws WireError naming the message (followed by `from`, e.g. " from
// rank 2") and the field.
template <typename T>
T decode_message(std::string_view bytes, const std::string& from = "") {
  WireReader in(bytes, WireFormat<T>::kName + from);
  T value = WireFormat<T>::read(in);
  in.expect_end();
  return value;
}

// Every rank's `text`, in rank order, on every rank (rank 0 gathers them
// and broadcasts them as one framed message). Collective.
std::vector<std::string> all_gather_texts(Communicator& comm, const std::string& text);

// `value` of rank `root` on every rank. Collective.
template <typename T>
void broadcast_message(Communicator& comm, T& value, int root) {
  std::string bytes = comm.rank() == root ? encode_message(value) : std::string();
  comm.broadcast(bytes, root);
  if (comm.rank() != root) value = decode_message<T>(bytes, " from rank " + std::to_string(root));
}

// Each rank's message of `texts` (rank r's at r), decoded.
template <typename T>
std::vector<T> decode_messages(const std::vector<std::string>& texts) {
  std::vector<T> all;
  for (size_t r = 0; r < texts.size(); ++r) {
    all.push_back(decode_message<T>(texts[r], " from rank " + std::to_string(r)));
  }
  return all;
}

// Every rank's `mine`, in rank order, on `root`; empty elsewhere. Collective.
template <typename T>
std::vector<T> gather_messages(Communicator& comm, const T& mine, int root) {
  return decode_messages<T>(comm.gather(encode_message(mine), root));
}

// Every rank's `mine`, in rank order, on every rank. Collective.
template <typename T>
std::vector<T> all_gather_messages(Communicator& comm, const T& mine) {
  return decode_messages<T>(all_gather_texts(comm, encode_message(mine)));
}

}  // namespace vtrain::worker
