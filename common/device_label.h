// How plans and people name a device: its name, and for a CPU the threads
// it computes with (CPU devices that differ only in device.threads share a
// name, and their times differ). Plans keep the two as fields of their own
// (balancer/plan.h, format 3); the text "AMD EPYC 7763 (2 threads)" is for
// people (`vtrain db stats`, `vtrain balance --devices`) and is what plan
// formats 1 and 2 stored.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace vtrain::common {

struct DeviceLabel {
  std::string name;            // the backend's device name, e.g. "AMD EPYC 7763 (cpus 0,1)"
  std::optional<int> threads;  // a CPU's thread count, >= 1; nullopt for a GPU (and for a
                               // CPU in a plan written before labels held the count)

  // "<name> (N threads)" ("(1 thread)"), or the name alone without threads.
  std::string text() const;
  // A text() back into its fields: a trailing qualifier is a thread count
  // only where it is exactly the one text() writes for that number; any
  // other text is a name as it is ("X (02 threads)", "X (cpus 0,1)").
  static DeviceLabel parse(std::string_view text);

  friend bool operator==(const DeviceLabel&, const DeviceLabel&) = default;
};

}  // namespace vtrain::common
