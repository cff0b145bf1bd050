// Where ranks that read alone meet: a group that does not exchange bytes still walks the pass
// in step, with a status round at a few fixed items, so a failure on one rank raises on every
// rank without a collective per tensor. The items come from the selection alone, which the
// handshake proved equal on every rank, so every rank meets at the same items whatever its
// memory, alignment or read backend. Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace instanttensor::loader {

class StepRounds {
 public:
  // Bytes handed out between two rounds: a rank learns of another's failure within this many
  // bytes (or at the end). A round (one small all-gather) costs well under a millisecond, but
  // each is a barrier where the ranks wait for the slowest, and ranks that read alone are
  // best left uncoupled: 3 ranks on 2 cores, warm, measured 1.26 s meeting only at the end
  // against 1.43 s meeting every 256 MiB (1 GB; alone: 0.80 s; noisy).
  static constexpr uint64_t kStrideBytes = 1ull << 30;

  // `item_bytes`: the bytes of each item of the plan, in storage order. Rounds: before the
  // first item past each multiple of `stride` bytes, and at the end (item count). Pure.
  explicit StepRounds(const std::vector<uint64_t>& item_bytes, uint64_t stride = kStrideBytes);

  // How many rounds a pass makes. Round k is every rank's k-th status round of the pass: a rank
  // that fails makes its next round at once, carrying the failure, and stops.
  size_t count() const { return at_items_.size(); }
  // The item before which round `round` runs (the item count for the end's).
  size_t item_of(size_t round) const { return at_items_[round]; }

 private:
  std::vector<size_t> at_items_;  // ascending, the last the item count
};

}  // namespace instanttensor::loader
