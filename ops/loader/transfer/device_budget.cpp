#include "loader/transfer/device_budget.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>

namespace instanttensor::loader {

uint64_t default_device_budget(c10::Device target, double free_share) {
  if (target.is_cpu()) return UINT64_MAX;
  try {
    c10::DeviceAllocator* allocator = c10::getDeviceAllocator(target.type());
    const size_t free_bytes = allocator->getMemoryInfo(target.index()).first;
    return std::max<uint64_t>(1,
                              static_cast<uint64_t>(static_cast<double>(free_bytes) * free_share));
  } catch (const c10::Error&) {
    // An allocator that is not a DeviceAllocator, or one without getMemoryInfo.
    return UINT64_MAX;
  }
}

}  // namespace instanttensor::loader
