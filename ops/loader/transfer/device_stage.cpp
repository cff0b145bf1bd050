#include "loader/transfer/device_stage.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/ScopeExit.h>

#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

DeviceStage::DeviceStage(c10::Device device, uint64_t staging_bytes, uint64_t staging_alignment,
                         uint64_t device_ring_bytes, uint64_t staging_min_bytes)
    : streams_(device),
      staging_(streams_, device.is_cpu() ? BorrowRing::Memory::Host : BorrowRing::Memory::Pinned,
               staging_bytes, staging_alignment, "the staging buffer", staging_min_bytes),
      device_ring_(streams_, BorrowRing::Memory::Device, std::max<uint64_t>(device_ring_bytes, 1),
                   256, "the device buffer") {}

DeviceStage::~DeviceStage() {
  try {
    close();
  } catch (...) {
    // Only a device allocation failure while copying out retained tensors lands here; the
    // loader's close() reports it, a destructor has no one to report to.
  }
}

bool DeviceStage::record_use_by_copies(c10::StorageImpl& owned) const noexcept {
  if (owned.device().is_cpu() || fence_dropped("owned_free")) return false;
  try {
    streams_.record_on_loader(owned.data_ptr());
  } catch (...) {
    // Not recorded: the consumer's stream waiting for the loader's orders the free still.
  }
  return true;
}

void DeviceStage::order_consumer_after_copies() const noexcept {
  try {
    CopyFence::after(streams_.loader()).block(streams_.consumer(), "owned_free");
  } catch (...) {
    // A device in error: nothing queued on it will run.
  }
}

c10::DataPtr DeviceStage::allocate_owned(uint64_t nbytes) const {
  c10::DeviceGuard guard(streams_.device());
  return c10::GetAllocator(streams_.device().type())->allocate(nbytes);
}

CopyFence DeviceStage::copy_to_device(const uint8_t* from, uint8_t* to, uint64_t nbytes) const {
  c10::DeviceGuard guard(streams_.device());
  c10::StreamGuard on_loader(streams_.loader());
  byte_view(to, nbytes, streams_.device())
      .copy_(byte_view(const_cast<uint8_t*>(from), nbytes, c10::Device(c10::DeviceType::CPU)),
             /*non_blocking=*/true);
  return CopyFence::after(streams_.loader());
}

c10::DataPtr DeviceStage::copy_on_device(const uint8_t* from, uint64_t nbytes) const {
  c10::DataPtr fresh = allocate_owned(nbytes);
  if (nbytes > 0) {
    c10::DeviceGuard guard(streams_.device());
    byte_view(static_cast<uint8_t*>(fresh.get()), nbytes, streams_.device())
        .copy_(byte_view(const_cast<uint8_t*>(from), nbytes, streams_.device()),
               /*non_blocking=*/true);
  }
  return fresh;
}

uint64_t DeviceStage::close() {
  // Whatever happens while copying retained tensors out (a device out of memory), the pinned
  // staging memory is only freed after the copies that read it have finished.
  auto release_staging = c10::make_scope_exit([this] {
    try {
      staging_.release_all();
    } catch (...) {
      // A failed wait on a device that is already in error; nothing more can be done.
    }
  });
  return device_ring_.release_all();
}

}  // namespace instanttensor::loader
