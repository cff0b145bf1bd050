// What the parts of a loader share while they run a pass over the read plan: the plan itself
// (read-only after open) and the state of the current pass. Consumer thread only.
#pragma once

#include <c10/core/StorageImpl.h>

#include <optional>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "instanttensor/error.h"
#include "loader/transfer/stream_fences.h"
#include "plan/load_mode.h"
#include "plan/memory_plan.h"
#include "plan/read_plan.h"

namespace instanttensor::loader {

// The checkpoint, the load mode, the read plan and the memory plan of one loader, with the
// lookups every part needs. Fixed at open; the parts keep a reference to the loader's.
struct PassPlan {
  std::unique_ptr<format::Checkpoint> checkpoint;
  plan::LoadMode mode;
  uint64_t device_budget = UINT64_MAX;  // staged: device bytes the loader may use (agreed)
  plan::ReadPlan reads;
  plan::MemoryPlan memory;    // ring sizes, read grouping and the unit cut
  uint64_t io_alignment = 1;  // O_DIRECT alignment of reads (1: buffered)
  uint64_t ring_alignment = 64;
  uint64_t chunk_size = 0;
  // Staged passes: the most bytes one read takes through staging before the ring caps it
  // (chunk_size, or for warm reads of a process alone a slice fitted to the CPU's cache).
  uint64_t staged_read_bytes = 0;

  const format::IndexedTensor& tensor_of_item(size_t item) const {
    return checkpoint->tensors()[reads.items[item]];
  }
  const format::IndexedTensor& first_tensor(size_t group) const {
    return tensor_of_item(reads.groups[group].first_item);
  }
  const std::string& file_of(const format::IndexedTensor& t) const {
    return checkpoint->path_of(t);
  }
  const std::string& first_path() const { return checkpoint->files()[0].path; }
  size_t unit_count(size_t group) const {
    return memory.layout.unit_count(reads.groups[group].length);
  }
  // Where group `g` lands, from the plan alone (every rank alike).
  plan::Destination destination_of(size_t group) const {
    return mode.destination_of(first_tensor(group).nbytes, device_budget);
  }
};

// One read group in the current pass.
struct GroupState {
  plan::Destination where = plan::Destination::HostOwned;
  plan::AlignedRange range;  // the group's bytes, widened for O_DIRECT
  uint8_t* dest = nullptr;   // the group's first byte in its destination
  bool placed = false;
  bool landed = false;         // every byte this rank reads is in `dest`
  bool verified = false;       // landed, and its file was unchanged after the reads
  size_t units_submitted = 0;  // units whose share (of this rank) was submitted
  size_t units_landed = 0;     // units whose share is in `dest`
  CopyFence landed_fence;      // device: after the last copy into `dest`
};

// One tensor (item) in the current pass: where its bytes are until it is handed out.
struct ItemState {
  c10::intrusive_ptr<c10::StorageImpl> owned;  // HostOwned / DeviceOwned
  c10::StorageImpl* borrowed = nullptr;        // held by its ring region
};

// Written by the pass alone (Pass's steps); the walks and the loader read it.
struct PassState {
  uint64_t id = 0;  // regions of rings remember the pass that placed them
  bool started = false;
  std::optional<Error> error;  // the pass failed: every later step says why
  std::vector<GroupState> groups;
  std::vector<ItemState> items;
  size_t next_group = 0;     // next group to place and submit
  size_t next_item = 0;      // next item to hand out
  uint64_t ahead_bytes = 0;  // owned destinations allocated and not yet handed out

  // A new pass over `plan`: every group unplaced, nothing handed out.
  void begin(const plan::ReadPlan& plan) {
    ++id;
    started = true;
    error.reset();
    groups.assign(plan.groups.size(), GroupState{});
    items.assign(plan.items.size(), ItemState{});
    next_group = next_item = 0;
    ahead_bytes = 0;
  }
};

}  // namespace instanttensor::loader
