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

// The file range to read for wanted bytes [offset, offset + length) when reads must start and
// end on `alignment` (O_DIRECT; 1 for buffered reads): the wanted bytes sit at `prefix` inside.
struct AlignedRange {
  uint64_t begin = 0;   // aligned file offset where the read starts
  uint64_t span = 0;    // aligned bytes to read (and to reserve in memory)
  uint64_t prefix = 0;  // offset of the wanted bytes inside the span
  uint64_t length = 0;  // wanted bytes
};
AlignedRange align_range(uint64_t offset, uint64_t length, uint64_t alignment);

// `value` rounded up to a multiple of `multiple` (> 0).
constexpr uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// One read request's share of a range: [offset, offset + length) relative to the span start,
// of which the first `required` bytes must arrive (the rest may lie past the end of the file).
struct Piece {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t required = 0;
};

// Splits a range into pieces of at most `chunk_size` bytes (a multiple of the alignment), so
// several workers can read one large tensor at once. Empty for an empty range.
std::vector<Piece> split_into_pieces(const AlignedRange& range, uint64_t chunk_size);

}  // namespace instanttensor::plan
