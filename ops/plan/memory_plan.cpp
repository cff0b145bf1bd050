#include "plan/memory_plan.h"

#include <algorithm>

#include "instanttensor/error.h"

namespace instanttensor::plan {

namespace {
using plan::defaults::kReadAheadBytes;
}  // namespace

uint64_t staging_ring_bytes(uint64_t requested, const std::string& file) {
  uint64_t bytes = requested ? requested : plan::defaults::kStagingBytes;
  if (bytes < kMinStagingBytes) {
    throw Error(ErrorKind::Argument, file, "",
                "staging_size=" + std::to_string(bytes) + " bytes is below the " +
                    std::to_string(kMinStagingBytes) + " bytes a staging ring needs");
  }
  return bytes;
}

uint64_t staging_slice_bytes(uint64_t chunk_size, uint64_t staging_bytes, uint64_t alignment) {
  uint64_t slice = std::min(chunk_size, staging_bytes / 2 - 2 * kMaxDirectAlignment);
  return std::max(alignment, slice / alignment * alignment);
}

uint64_t exchange_share_bytes(uint64_t piece, int world) {
  if (world <= 1 || piece == 0) return piece;
  return piece * std::clamp<uint64_t>(kExchangeShareBytes / piece, 1, kExchangePieces);
}

MemoryPlan plan_memory(const MemoryInputs& in, const DescribeTensor& describe,
                       const std::string& file) {
  const bool exchanging = in.world > 1;
  auto falls_back = [&](uint64_t nbytes) {
    return in.staged && in.host_fallback && nbytes > in.device_budget;
  };
  uint64_t largest = 0, total = 0, largest_device = 0, total_device = 0;
  size_t largest_index = 0, largest_device_index = 0;
  for (size_t i = 0; i < in.tensor_bytes.size(); ++i) {
    uint64_t nbytes = in.tensor_bytes[i];
    total += nbytes;
    if (nbytes >= largest) largest = nbytes, largest_index = i;
    if (!falls_back(nbytes)) {
      total_device += nbytes;
      if (nbytes >= largest_device) largest_device = nbytes, largest_device_index = i;
    }
  }
  auto refuse = [&](size_t index, const std::string& what, uint64_t have, uint64_t need) {
    auto [tensor_file, name] = describe(index);
    throw Error(ErrorKind::Argument, tensor_file, name,
                "tensor of " + std::to_string(in.tensor_bytes[index]) + " bytes does not fit " +
                    what + "=" + std::to_string(have) + " bytes (needs at least " +
                    std::to_string(need) + ")");
  };
  const uint64_t count = in.tensor_bytes.size();
  const uint64_t read_ahead = std::max<uint64_t>(std::min(total, kReadAheadBytes), 1);
  MemoryPlan plan;
  plan.layout = UnitLayout(exchange_share_bytes(in.chunk_size, in.world), in.world);
  const uint64_t padding = exchanging ? plan.layout.padding() : 0;

  if (!in.staged) {
    if (in.copy && !exchanging) {  // each tensor read into its own storage
      plan.buffer_size = in.buffer_size ? in.buffer_size : read_ahead;
      return plan;
    }
    // A region per group in the host ring: two of the largest (the live one and the next)
    // plus read-ahead, but never more than the whole selection needs.
    const uint64_t overhead = in.ring_alignment + in.read_widening + padding;
    const uint64_t slot = largest + overhead;
    const uint64_t whole = total + overhead * count + slot;
    plan.buffer_size =
        in.buffer_size ? in.buffer_size : std::min(2 * slot + kReadAheadBytes, whole);
    if (slot > plan.buffer_size) {
      refuse(largest_index, "a borrow buffer of buffer_size", plan.buffer_size, slot);
    }
    plan.host_ring_bytes = plan.buffer_size;
    plan.max_group_bytes =
        std::min(exchanging ? plan.layout.unit_bytes : in.chunk_size, plan.host_ring_bytes / 4);
    return plan;
  }

  if (!in.host_fallback && largest > in.device_budget) {
    refuse(largest_index, "the device memory budget", in.device_budget, largest);
  }
  // Staging: a few chunks, whatever the checkpoint; large tensors stream through in slices.
  plan.staging_bytes = staging_ring_bytes(in.staging_size, file);
  // One read, widened for O_DIRECT, takes at most half the staging ring; a share, a few reads.
  const uint64_t staged_read =
      in.staged_read_bytes ? std::min(in.staged_read_bytes, in.chunk_size) : in.chunk_size;
  plan.staging_slice =
      staging_slice_bytes(staged_read, plan.staging_bytes, UnitLayout::kSliceAlignment);
  plan.layout = UnitLayout(exchange_share_bytes(plan.staging_slice, in.world), in.world);
  if (in.copy && !exchanging) {
    // Owned device tensors: buffer_size bounds the device bytes allocated ahead of the consumer.
    plan.buffer_size = std::min(in.buffer_size ? in.buffer_size : read_ahead, in.device_budget);
    return plan;
  }
  if (in.buffer_size > in.device_budget) {
    throw Error(ErrorKind::Argument, file, "",
                "buffer_size=" + std::to_string(in.buffer_size) +
                    " bytes exceeds the device memory budget of " +
                    std::to_string(in.device_budget) +
                    " bytes (max_free_mem_usage x free device memory)");
  }
  // The device ring holds the tensors that go to the device, and fits the budget.
  const uint64_t slot = largest_device + kDeviceRingAlignment + padding;
  const uint64_t whole = total_device + (kDeviceRingAlignment + padding) * count + slot;
  plan.buffer_size = in.buffer_size
                         ? in.buffer_size
                         : std::min({2 * slot + kReadAheadBytes, whole, in.device_budget});
  if (slot > plan.buffer_size) {
    refuse(largest_device_index, "a device buffer of buffer_size", plan.buffer_size, slot);
  }
  plan.device_ring_bytes = plan.buffer_size;
  plan.max_group_bytes = std::min(plan.layout.unit_bytes, plan.device_ring_bytes / 4);
  return plan;
}

}  // namespace instanttensor::plan
