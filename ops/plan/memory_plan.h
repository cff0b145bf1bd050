// How much memory each stage of a load gets and how reads are grouped: a pure function of the
// selection and the options, so every rank of a distributed load computes the same plan.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "plan/defaults.h"
#include "plan/unit_layout.h"

namespace instanttensor::plan {

struct MemoryInputs {
  std::vector<uint64_t> tensor_bytes;  // the selected tensors, any order
  bool copy = true;
  bool staged = false;         // through the transfer stage (accelerator, or forced)
  bool host_fallback = false;  // staged: tensors over the budget stay on the host
  int world = 1;               // ranks exchanging units (1: none)
  uint64_t buffer_size = 0;    // explicit, or 0 to derive
  uint64_t staging_size = 0;   // explicit, or 0 for the default
  uint64_t chunk_size = plan::defaults::kChunkBytes;  // bytes per read request
  uint64_t staged_read_bytes = 0;       // staged: a read through staging at most (0: chunk_size)
  uint64_t read_widening = 0;           // O_DIRECT widening of one read (both ends)
  uint64_t ring_alignment = 64;         // placement alignment in the host rings
  uint64_t device_budget = UINT64_MAX;  // staged: device bytes the loader may use
};

struct MemoryPlan {
  uint64_t buffer_size = 0;        // the figure stats report (a ring, or the read-ahead)
  uint64_t host_ring_bytes = 0;    // the host borrow / exchange ring (0: none)
  uint64_t staging_bytes = 0;      // staged: the staging ring
  uint64_t device_ring_bytes = 0;  // staged: the device ring (0: owned device tensors)
  uint64_t max_group_bytes = 0;    // read groups merge neighbours up to this (0: one tensor)
  uint64_t staging_slice = 0;      // staged: the most bytes one read takes through staging
  // Ranks exchanging: each rank's share of a unit (exchange_share_bytes); one rank alone: a unit
  // is a read of at most the staging slice (staged) or the chunk size.
  UnitLayout layout{plan::defaults::kChunkBytes, 1};
};

// Each rank's share of an exchange unit, from the most bytes one of its reads takes (`piece`: the
// staging slice, or the chunk size): `piece` for a rank alone; for ranks, whole pieces up to
// kExchangeShareBytes, at least one and at most kExchangePieces. Every unit costs the ranks a
// status round and a gather, whose fixed costs (a rendezvous of the ranks, a sync on a GPU) 8 MiB
// shares paid 58 times a GB (2 simulated ranks: 2.9x one rank's time read-bound); a share is
// read in pieces, so a bigger one leaves the reads and the staging as they were. Pure.
constexpr uint64_t kExchangeShareBytes = 32ull << 20;
constexpr uint64_t kExchangePieces = 4;
uint64_t exchange_share_bytes(uint64_t piece, int world);

// Names a tensor of `tensor_bytes` by its index: (file, tensor name), for errors.
using DescribeTensor = std::function<std::pair<std::string, std::string>(size_t)>;

// The plan, or Error(Argument) before anything is allocated: a tensor that cannot fit a ring or
// the device budget (naming it through `describe`), a buffer over the budget, a staging ring
// below its minimum (`file` names the checkpoint). A tensor that falls back to the host is larger
// than the budget, so larger than max_group_bytes: it always forms a read group of its own.
MemoryPlan plan_memory(const MemoryInputs& in, const DescribeTensor& describe,
                       const std::string& file);

// The staging ring's size: `requested` (0: plan::defaults::kStagingBytes), or Error(Argument)
// naming `file` below kMinStagingBytes. Used by the staged path and by load_into's bounce ring.
uint64_t staging_ring_bytes(uint64_t requested, const std::string& file);

// The most bytes one read may stream through a staging ring of `staging_bytes`: half of it minus
// the widest O_DIRECT widening (so two are in flight), at most `chunk_size`, a multiple of
// `alignment` (a power of two) and at least one.
uint64_t staging_slice_bytes(uint64_t chunk_size, uint64_t staging_bytes, uint64_t alignment);

// The largest O_DIRECT alignment planned for: ranks exchanging must size alike whatever each
// one's filesystem alignment is, so they plan with this one.
constexpr uint64_t kMaxDirectAlignment = 4096;
constexpr uint64_t kMinStagingBytes = 32ull << 10;

// The staging bytes one read of `slice` bytes may take: widened for O_DIRECT and placed at an
// aligned offset.
inline uint64_t staging_slot_bytes(uint64_t slice) { return slice + 3 * kMaxDirectAlignment; }
// The smallest staging ring that still holds two such reads: where pinning the whole ring is
// refused, a pinned ring this small keeps reads and copies overlapping with the planned slices.
inline uint64_t staging_ring_min_bytes(uint64_t slice) { return 2 * staging_slot_bytes(slice); }
constexpr uint64_t kDeviceRingAlignment = 256;  // what device allocators hand out

}  // namespace instanttensor::plan
