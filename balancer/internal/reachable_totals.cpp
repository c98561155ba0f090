#include "balancer/internal/reachable_totals.h"

#include <algorithm>
#include <cassert>

namespace vtrain::balancer::internal {
namespace {

// dst |= src << shift, dropping bits past dst's end. Safe when dst is src:
// words are written from the top down, each from words below it that are
// not yet written.
void or_shifted(const std::vector<uint64_t>& src, int64_t shift, std::vector<uint64_t>& dst) {
  const auto word_shift = static_cast<size_t>(shift / 64);
  const auto bit_shift = static_cast<unsigned>(shift % 64);
  for (size_t w = dst.size(); w-- > word_shift;) {
    uint64_t moved = src[w - word_shift] << bit_shift;
    if (bit_shift != 0 && w > word_shift) moved |= src[w - word_shift - 1] >> (64 - bit_shift);
    dst[w] |= moved;
  }
}

}  // namespace

ReachableTotals::ReachableTotals(int64_t limit) : ReachableTotals(limit, true) {}

ReachableTotals::ReachableTotals(int64_t limit, bool with_zero)
    : words_(static_cast<size_t>(limit / 64 + 1), 0), limit_(limit) {
  assert(limit >= 0);
  if (with_zero) words_[0] = 1;
}

bool ReachableTotals::contains(int64_t total) const {
  return total >= 0 && total <= limit_ && (words_[static_cast<size_t>(total / 64)] >> (total % 64) & 1) != 0;
}

bool ReachableTotals::empty() const {
  for (uint64_t word : words_) {
    if (word != 0) return false;
  }
  return true;
}

ReachableTotals ReachableTotals::none() const { return ReachableTotals(limit_, false); }

void ReachableTotals::add_shifted(int64_t low, int64_t high, ReachableTotals& out) const {
  assert(out.limit_ == limit_ && 0 <= low && low <= high);
  if (low > limit_) return;
  // spread = union of this << s for 0 <= s < span, built by binary
  // decomposition of span: `power` holds the union over 2^i shifts. Shifts
  // past the limit would only produce dropped totals.
  const int64_t span = std::min(high, limit_) - low + 1;
  std::vector<uint64_t> spread(words_.size(), 0);
  std::vector<uint64_t> power = words_;
  int64_t offset = 0;
  for (int64_t step = 1; step <= span; step *= 2) {
    if ((span & step) != 0) {
      or_shifted(power, offset, spread);
      offset += step;
    }
    if (step * 2 <= span) or_shifted(power, step, power);
  }
  or_shifted(spread, low, out.words_);
  // Bits past limit_ in the last word stand for totals out of range.
  const int64_t used = (limit_ + 1) % 64;
  if (used != 0) out.words_.back() &= (uint64_t{1} << used) - 1;
}

}  // namespace vtrain::balancer::internal
