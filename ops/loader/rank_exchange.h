// Distributed loading over a c10d ProcessGroup: who reads what, the handshake, the exchanges.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "instanttensor/error.h"

namespace instanttensor::loader {

// Each read group goes to one rank, in contiguous runs of about total/world bytes, so every
// rank reads about 1/world of the selected bytes and mostly sequentially.
std::vector<int> assign_owners(const std::vector<uint64_t>& group_bytes, int world);

// The collectives of one loader. Every rank must make the same calls in the same order (the
// loader guarantees it: one exchange per read group, in storage order). Tensors passed to the
// group are CPU tensors, so the group needs a CPU backend (gloo). Consumer thread only.
class RankExchange {
 public:
  explicit RankExchange(c10::intrusive_ptr<c10d::ProcessGroup> group);
  int rank() const { return rank_; }
  int world() const { return world_; }

  // Gathers every rank's digest of files, sizes and selection; throws Error(Argument) on every
  // rank, naming the ranks that differ, when they do not all match. `file` names the checkpoint.
  void handshake(uint64_t digest, const std::string& file);

  // Moves `nbytes` at `data` from `owner` to every rank. Every rank first contributes a status
  // word (and its error message, if it failed: a read error, a changed file, ...), gathered by
  // all, so a failure on any rank raises on every rank instead of leaving the others waiting.
  void exchange(int owner, uint8_t* data, uint64_t nbytes, const std::optional<Error>& failure);

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  int rank_ = 0;
  int world_ = 1;
};

}  // namespace instanttensor::loader
