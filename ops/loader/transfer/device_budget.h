// The device memory a loader may use when the caller does not say: a share of what the target's
// allocator reports free. The one computation of it, for every API (C++ OpenOptions, the Loader
// class, Python's safe_open).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace instanttensor::loader {

// `free_share` (in (0, 1]) of the free memory of `target` (an accelerator with a concrete index)
// as its allocator reports it now (c10::DeviceAllocator::getMemoryInfo, cudaMemGetInfo for CUDA),
// at least 1 byte; UINT64_MAX (unlimited) when the allocator cannot say. Any thread.
uint64_t default_device_budget(c10::Device target, double free_share);

}  // namespace instanttensor::loader
