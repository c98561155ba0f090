// Processes on one host that profile the same device identity (perf DB
// device) at once, and how they share the work items (kernel, micro-batch;
// copy bandwidth; layer costs per batch; steps per batch).
#pragma once

#include <cstdint>
#include <functional>

namespace vtrain::worker {

struct ProfilePeers {
  int index = 0;  // this process among them
  int count = 1;
  // false: work item j is measured by member j % count alone (identical
  // GPUs each measure on their own device, and the work is split).
  // true: every member measures every item at the same time (CPU processes
  // sharing the host's cores: each measurement meets the contention
  // training will; measured one at a time, each met it by chance).
  bool together = false;
  // With together and count > 1: a collective over the members, true when
  // any member passes true. Every member calls it once per work item, in
  // the same order.
  std::function<bool(bool)> any;
};

// What this process does with one work item.
enum class Turn { kMeasure, kCached, kSkip };

// What a process finds of one work item: whether it can measure it (it fits
// its device), and whether the perf DB holds it.
struct ItemState {
  bool can = true;
  bool cached = false;
};

// Deals the work items to the peers. Every member calls take() once per
// item, in the same order, whatever it can or needs to do with it.
class WorkTurns {
 public:
  explicit WorkTurns(const ProfilePeers& peers) : peers_(peers) {}

  // `look` says what this process finds of the item; split, it is called
  // only for this process's own items. kSkip for an item that is not this
  // process's or that it cannot measure; kCached when no member needs it
  // (together) or the DB holds it (split); else kMeasure.
  template <typename Look>
  Turn take(const Look& look) {
    ++item_;
    if (peers_.together && peers_.count > 1) {
      const ItemState s = look();
      const bool needed = peers_.any(s.can && !s.cached);
      if (!s.can) return Turn::kSkip;
      return needed ? Turn::kMeasure : Turn::kCached;
    }
    if (item_ % peers_.count != peers_.index) return Turn::kSkip;
    const ItemState s = look();
    if (!s.can) return Turn::kSkip;
    return s.cached ? Turn::kCached : Turn::kMeasure;
  }

 private:
  const ProfilePeers& peers_;
  int64_t item_ = -1;
};

}  // namespace vtrain::worker
