// Processes on one host that profile the same device identity (perf DB
// device) at once, and how they share the work items (kernel, micro-batch;
// copy bandwidth; layer costs per batch; steps per batch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/device/backend.h"

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
  // With together and count > 1: a barrier of the members that runs `work`
  // (when not null) until every member has arrived. Each member arrives
  // once per work item, after its measurement (WorkTurns::done), so the
  // faster ones keep loading the shared cores while the slower measure, as
  // every rank computes until the end of a balanced step in training.
  // Null: members do not wait for each other.
  std::function<void(const std::function<void()>&)> keep_busy;
  // With together and count > 1: a collective over the members returning
  // every member's `text`, in member order, on every member. Before the
  // first item the members compare what decides their item lists
  // (require_same_items). Null: no check.
  std::function<std::vector<std::string>(const std::string&)> all_texts;
  std::vector<int> ranks;  // the members' job ranks, in member order, for messages
};

// Together, every member walks the same work items, one collective each;
// members whose settings give other items would wait on each other for
// ever (an MPMD run with another profile.batches on one rank). `settings`
// is this member's "name: value" lines that decide its items. Throws
// std::invalid_argument, on every member alike, naming the first line that
// differs and the ranks on either side. A collective (with all_texts).
void require_same_items(const ProfilePeers& peers, const std::string& settings);

// Which ranks profile as one group, from every rank's device: each rank's
// group colour, the lowest rank of its group. CPU processes on one host
// that share a core (their cpus overlap; none listed is every one) are one
// group whatever their devices (a slice under a quota of its own is one of
// its own) and measure together, so that each measurement meets the
// contention training will. Other ranks group with the ranks of the same
// perf DB device on their host (identical GPUs), which split the items.
std::vector<int> profile_group_colours(const std::vector<DeviceInfo>& ranks);

// What this process does with one work item.
enum class Turn { kMeasure, kCached, kSkip };

// What a process finds of one work item: whether it can measure it (it fits
// its device), and whether the perf DB holds it.
struct ItemState {
  bool can = true;
  bool cached = false;
};

// Deals the work items to the peers. Every member calls take() once per
// item, in the same order, whatever it can or needs to do with it, and
// then done() once (with the item's work when it measured it).
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

  // The end of this member's part in the item. Together, it waits for the
  // other members, running `work` (one more run of what it measured; null
  // when it measured nothing) meanwhile; split, it returns at once.
  void done(const std::function<void()>& work = {}) const {
    if (peers_.together && peers_.count > 1 && peers_.keep_busy) peers_.keep_busy(work);
  }

  // One item's whole turn: take() it and, when it is this process's to
  // measure, run `measure`, which ends the turn itself (done(), with the
  // work to repeat while the others finish); any other turn ends at once.
  // Returns the turn, for the caller's counts.
  template <typename Look, typename Measure>
  Turn play(const Look& look, const Measure& measure) {
    const Turn turn = take(look);
    if (turn == Turn::kMeasure) {
      measure();
    } else {
      done();
    }
    return turn;
  }

  // An item dealt before, again (a later round over the same items):
  // `mine` says whether this process measured it then; it measures it
  // again as play() does, or ends its turn at once. Together, members
  // keep step with one `any` per item, as take() does.
  template <typename Measure>
  void replay(bool mine, const Measure& measure) const {
    if (peers_.together && peers_.count > 1) peers_.any(false);
    if (mine) {
      measure();
    } else {
      done();
    }
  }

 private:
  const ProfilePeers& peers_;
  int64_t item_ = -1;
};

}  // namespace vtrain::worker
