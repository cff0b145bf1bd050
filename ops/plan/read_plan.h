// Turning the selected tensors of a checkpoint into read groups and pieces, torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "format/checkpoint.h"

namespace instanttensor::plan {

// A contiguous byte range of one file holding whole tensors [first_item, first_item + item_count)
// of the plan, read into one contiguous destination.
struct ReadGroup {
  size_t file_index = 0;
  uint64_t file_offset = 0;
  uint64_t length = 0;
  size_t first_item = 0;
  size_t item_count = 0;
};

struct ReadPlan {
  std::vector<size_t> items;      // checkpoint tensor indices, storage order
  std::vector<ReadGroup> groups;  // in storage order; every item in exactly one group
  std::vector<size_t> group_of;   // item -> group
  uint64_t total_bytes = 0;       // sum of the selected tensors' bytes
  uint64_t largest_tensor = 0;    // bytes of the largest selected tensor
};

// Builds the plan for `selected` (checkpoint tensor indices, any order, no duplicates): items
// sorted into storage order; neighbours that touch in the same file are merged into one group
// while the group stays within `max_group_bytes` (0: one group per tensor). A tensor larger than
// the limit forms a group of its own. Only the selected byte ranges are covered.
ReadPlan make_read_plan(const format::Checkpoint& checkpoint, std::vector<size_t> selected,
                        uint64_t max_group_bytes);

// One read request's share of a group: [offset, offset + length) relative to the group start.
struct Piece {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Splits a group of `length` bytes into pieces of at most `chunk_size` bytes (chunk_size > 0), so
// that several workers can read one large tensor at once. Empty for length 0.
std::vector<Piece> split_into_pieces(uint64_t length, uint64_t chunk_size);

}  // namespace instanttensor::plan
