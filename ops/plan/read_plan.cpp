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

std::vector<Piece> split_into_pieces(uint64_t length, uint64_t chunk_size) {
  std::vector<Piece> pieces;
  for (uint64_t offset = 0; offset < length; offset += chunk_size) {
    pieces.push_back(Piece{offset, std::min(chunk_size, length - offset)});
  }
  return pieces;
}

}  // namespace instanttensor::plan
