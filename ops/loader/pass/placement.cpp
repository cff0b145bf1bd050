#include "loader/pass/placement.h"

#include <algorithm>

#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

bool OwnedPlacement::place(size_t g, PassState& pass, bool force) {
  const plan::ReadGroup& group = plan_.reads.groups[g];
  GroupState& state = pass.groups[g];
  if (pass.ahead_bytes > 0 && pass.ahead_bytes + group.length > bound_ && !force) return false;
  c10::DataPtr memory = stage_ ? stage_->allocate_owned(group.length)
                               : recycled_->allocate_window(state.range.span, state.range.prefix,
                                                            plan_.ring_alignment, "a tensor");
  state.dest = static_cast<uint8_t*>(memory.get());
  pass.items[group.first_item].owned = make_owned_storage(std::move(memory), group.length);
  pass.ahead_bytes += group.length;
  stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, pass.ahead_bytes);
  state.placed = true;
  return true;
}

bool RingPlacement::place(size_t g, PassState& pass, bool force) {
  const plan::ReadGroup& group = plan_.reads.groups[g];
  GroupState& state = pass.groups[g];
  const bool on_device = ring_.memory() == BorrowRing::Memory::Device;
  const auto& first = plan_.first_tensor(g);
  const uint64_t data_offset =
      first.file_offset - plan_.checkpoint->files()[first.file_index].header.data_start();
  // Keep each tensor's alignment relative to the data buffer; an O_DIRECT host region starts on
  // a block instead, so data sits at its file offset modulo the block size. Device regions are
  // filled by copies, never by O_DIRECT reads.
  const uint64_t span = (on_device ? group.length : state.range.span) + padding_;
  const uint64_t phase = on_device || plan_.io_alignment == 1 ? data_offset : 0;
  BorrowRing::Region* region;
  while (!(region = ring_.place(span, phase))) {
    if (!reclaim_oldest(pass, force)) return false;
  }
  state.dest = region->data + (on_device ? 0 : state.range.prefix);
  region->pass = pass.id;
  region->first_item = group.first_item;
  region->item_count = group.item_count;
  uint64_t offset = 0;
  for (size_t item = group.first_item; item < group.first_item + group.item_count; ++item) {
    uint64_t nbytes = plan_.tensor_of_item(item).nbytes;
    pass.items[item].borrowed = ring_.borrow(*region, state.dest + offset, nbytes);
    offset += nbytes;
  }
  stats_.peak_pool_bytes = std::max(stats_.peak_pool_bytes, ring_.bytes_in_use());
  state.placed = true;
  return true;
}

bool RingPlacement::reclaim_oldest(const PassState& pass, bool force) {
  auto& regions = ring_.regions();
  if (regions.empty()) return false;
  const auto& oldest = regions.front();
  if (oldest.pass == pass.id) {
    size_t end = oldest.first_item + oldest.item_count;
    // Items not handed out yet are read-ahead; the item handed out last is live (the consumer's
    // loop variable still binds it) and is only copied out when nothing else can make room.
    if (end > pass.next_item) return false;
    if (end + 1 > pass.next_item && !force) return false;
  }
  auto start = Clock::now();
  stats_.materializations += ring_.release_oldest();
  stats_.copy_seconds += seconds_since(start);
  return true;
}

void RingPlacement::release_consumed(const PassState& pass) {
  // One event per region marks the point; reuse waits on that region's event only.
  for (auto& region : ring_.regions()) {
    if (region.pass == pass.id && region.first_item + region.item_count > pass.next_item) break;
    if (!region.release_marked) ring_.mark_released(region);
  }
}

}  // namespace instanttensor::loader
