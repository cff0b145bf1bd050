// BorrowRing (loader/transfer/borrow_ring.h) on host memory: regions placed at the head and
// released from the tail with their phase kept; a storage the consumer still holds is copied out at
// release (bytes unchanged, views follow), one it dropped is not; at close, held storages keep
// their bytes where they are.
#include <gtest/gtest.h>

#include <cstring>

#include "loader/transfer/borrow_ring.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {
namespace {

struct HostRing {
  LoaderStreams streams{c10::Device(c10::DeviceType::CPU)};
  BorrowRing ring{streams, BorrowRing::Memory::Host, 4096, 64, "the test ring"};
};

at::Tensor bytes_of(c10::StorageImpl* storage) {
  return tensor_over(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage), at::kByte,
                     {static_cast<int64_t>(storage->nbytes())});
}

TEST(BorrowRing, RegionsKeepTheirPhaseAndTheRingRefusesWhatDoesNotFit) {
  HostRing host;
  auto* a = host.ring.place(1000, 5);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 64, 5u);
  auto* b = host.ring.place(2000, 0);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 64, 0u);
  EXPECT_GE(b->data, a->data + 1000);
  EXPECT_EQ(host.ring.place(2000, 0), nullptr);  // until the oldest is released
  EXPECT_EQ(host.ring.release_oldest(), 0u);
  // FIFO and contiguous: what a's release freed (at the front) and the tail hold 1000 bytes each,
  // never 2000 in one piece.
  EXPECT_EQ(host.ring.place(2000, 0), nullptr);
  auto* tail = host.ring.place(1000, 0);
  ASSERT_NE(tail, nullptr);
  EXPECT_GE(tail->data, b->data + 2000);
  auto* wrapped = host.ring.place(900, 0);  // wraps into a's space
  ASSERT_NE(wrapped, nullptr);
  EXPECT_LT(wrapped->data, b->data);
  EXPECT_EQ(host.ring.regions().size(), 3u);
}

TEST(BorrowRing, AHeldStorageIsCopiedOutAtReleaseADroppedOneIsNot) {
  HostRing host;
  auto* region = host.ring.place(256, 0);
  ASSERT_NE(region, nullptr);
  for (int i = 0; i < 256; ++i) region->data[i] = static_cast<uint8_t>(i);
  at::Tensor kept = bytes_of(host.ring.borrow(*region, region->data, 128));
  at::Tensor view = kept.narrow(0, 10, 5);  // views follow the repointed storage
  { at::Tensor dropped = bytes_of(host.ring.borrow(*region, region->data + 128, 128)); }
  uint8_t* ring_bytes = region->data;
  EXPECT_EQ(kept.data_ptr(), ring_bytes);
  EXPECT_EQ(host.ring.release_oldest(), 1u);  // only the held one
  EXPECT_NE(kept.data_ptr(), ring_bytes);
  std::memset(ring_bytes, 0xEE, 256);  // the ring's memory is reused
  for (int i = 0; i < 128; ++i) EXPECT_EQ(kept[i].item<uint8_t>(), i);
  EXPECT_EQ(view[0].item<uint8_t>(), 10);
}

TEST(BorrowRing, AtCloseHeldStoragesKeepTheirBytesWhereTheyAre) {
  HostRing host;
  auto* region = host.ring.place(300, 0);
  ASSERT_NE(region, nullptr);
  for (int i = 0; i < 300; ++i) region->data[i] = static_cast<uint8_t>(3 * i);
  at::Tensor kept = bytes_of(host.ring.borrow(*region, region->data + 100, 100));
  void* where = kept.data_ptr();
  EXPECT_EQ(host.ring.release_all(), 0u);  // handed over, not copied
  EXPECT_EQ(kept.data_ptr(), where);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(kept[i].item<uint8_t>(), static_cast<uint8_t>(3 * (100 + i)));
  EXPECT_TRUE(host.ring.regions().empty());
  EXPECT_EQ(host.ring.bytes_in_use(), 0u);
}

}  // namespace
}  // namespace instanttensor::loader
