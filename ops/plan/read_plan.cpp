#include "plan/read_plan.h"

#include <algorithm>

namespace instanttensor::plan {

ReadPlan make_read_plan(const format::Checkpoint& checkpoint, std::vector<size_t> selected,
                        uint64_t max_group_bytes) {
  // Checkpoint indices are already storage order, so sorting indices sorts by (file, offset).
  std::sort(selected.begin(), selected.end());
  ReadPlan plan;
  plan.items = std::move(selected);
  plan.group_of.resize(plan.items.size());
  const auto& tensors = checkpoint.tensors();
  for (size_t item = 0; item < plan.items.size(); ++item) {
    const auto& t = tensors[plan.items[item]];
    plan.total_bytes += t.nbytes;
    plan.largest_tensor = std::max(plan.largest_tensor, t.nbytes);
    bool merge = false;
    if (!plan.groups.empty()) {
      const ReadGroup& last = plan.groups.back();
      merge = last.file_index == t.file_index && last.file_offset + last.length == t.file_offset &&
              last.length + t.nbytes <= max_group_bytes;
    }
    if (merge) {
      plan.groups.back().length += t.nbytes;
      plan.groups.back().item_count += 1;
    } else {
      plan.groups.push_back(ReadGroup{t.file_index, t.file_offset, t.nbytes, item, 1});
    }
    plan.group_of[item] = plan.groups.size() - 1;
  }
  return plan;
}

AlignedRange align_range(uint64_t offset, uint64_t length, uint64_t alignment) {
  AlignedRange range;
  range.length = length;
  if (length == 0) return range;
  range.begin = offset / alignment * alignment;
  uint64_t end = (offset + length + alignment - 1) / alignment * alignment;
  range.span = end - range.begin;
  range.prefix = offset - range.begin;
  return range;
}

std::vector<Piece> split_into_pieces(const AlignedRange& range, uint64_t chunk_size) {
  std::vector<Piece> pieces;
  const uint64_t needed_end = range.prefix + range.length;
  for (uint64_t offset = 0; offset < range.span; offset += chunk_size) {
    uint64_t length = std::min(chunk_size, range.span - offset);
    uint64_t required = needed_end > offset ? std::min(length, needed_end - offset) : 0;
    pieces.push_back(Piece{offset, length, required});
  }
  return pieces;
}

}  // namespace instanttensor::plan
