// Host memory of owned tensors: blocks given back by dropped tensors and reused for new ones; the
// memory advice given to it, checked.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/memory_advice.h"
#include "pool/host_buffer.h"
#include "pool/recycled_blocks.h"

namespace instanttensor {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

uintptr_t block_of(const c10::DataPtr& data, uint64_t prefix) {
  return reinterpret_cast<uintptr_t>(data.get()) - prefix;
}

bool is_mapped(void* address, uint64_t length) {
  std::vector<unsigned char> pages((length + 4095) / 4096);
  return ::mincore(address, length, pages.data()) == 0;  // ENOMEM: not mapped
}

// Every madvise result is checked: advice the kernel takes costs nothing more; advice it refuses
// (here a real refusal: MADV_REMOVE of private anonymous pages is EINVAL; not MADV_DONTNEED of
// locked pages, since the sanitizers make mlock a no-op) is counted and the first one described,
// and the memory is left as it was.
TEST(MemoryAdvice, ARefusalIsCountedAndDescribedAndLeavesTheMemoryAsItWas) {
  const uint64_t length = 4 * 4096;
  auto* memory = static_cast<uint8_t*>(
      ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(memory, MAP_FAILED);
  std::memset(memory, 0x5a, length);
  const uint64_t before = io::advice_refusals();
  EXPECT_TRUE(io::advise(memory, length, MADV_NORMAL, "a test's pages"));
  EXPECT_EQ(io::advice_refusals(), before);
  EXPECT_FALSE(io::advise(memory, length, MADV_REMOVE, "a test's private pages"));
  EXPECT_EQ(io::advice_refusals(), before + 1);
  EXPECT_EQ(memory[length - 1], 0x5a);  // not given back: the bytes are still there
  const std::string first = io::first_advice_refusal();
  if (before == 0) {
    EXPECT_EQ(first, "MADV_REMOVE of 16384 bytes (a test's private pages): Invalid argument");
  } else {
    EXPECT_FALSE(first.empty());  // an earlier refusal in this process is the one described
  }
  // An unaligned start is refused like any other advice: counted, never thrown.
  EXPECT_FALSE(io::advise(memory + 1, 4096, MADV_NORMAL, "a test's unaligned range"));
  EXPECT_EQ(io::advice_refusals(), before + 2);
  ::munmap(memory, length);
}

// Large blocks are mappings of their own (not malloc's heap, whose changes wait for the page
// faults read workers take in it), 2 MiB-aligned, and unmapped when freed.
TEST(HostBuffer, LargeBlocksAreMappingsOfTheirOwnAndGoWhenFreed) {
  void* address;
  {
    c10::DataPtr data = pool::allocate_host_window(5 * kMiB, 100, 4096, "a tensor");
    address = static_cast<char*>(data.get()) - 100;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(address) % (2 * kMiB), 0u);
    ASSERT_TRUE(is_mapped(address, 6 * kMiB));
    static_cast<char*>(data.get())[5 * kMiB - 101] = 1;  // the whole span is writable
  }
  EXPECT_FALSE(is_mapped(address, 6 * kMiB));
  EXPECT_EQ(errno, ENOMEM);
  c10::DataPtr small = pool::allocate_host(4096, true, "a tensor");  // malloc's, prefaulted
  EXPECT_EQ(static_cast<char*>(small.get())[4095], 0);
}

TEST(RecycledBlocks, ADroppedBlockServesTheNextRequestOfASimilarSize) {
  auto keeper = std::make_shared<pool::RecycledBlocks>(64 * kMiB);
  uintptr_t first;
  {
    c10::DataPtr data = keeper->allocate_window(4 * kMiB, 512, 4096, "a tensor");
    first = block_of(data, 512);
    EXPECT_EQ(first % (2 * kMiB), 0u);  // huge-page aligned, as fresh blocks are
    EXPECT_EQ(keeper->kept_bytes(), 0u);
  }
  EXPECT_EQ(keeper->kept_bytes(), 4 * kMiB);
  c10::DataPtr again = keeper->allocate_window(4 * kMiB - 100, 0, 4096, "a tensor");
  EXPECT_EQ(block_of(again, 0), first);
  EXPECT_EQ(keeper->reuses(), 1u);
  EXPECT_EQ(keeper->kept_bytes(), 0u);
}

TEST(RecycledBlocks, ABlockIsNotReusedForAMuchSmallerOrALargerRequest) {
  auto keeper = std::make_shared<pool::RecycledBlocks>(64 * kMiB);
  { c10::DataPtr data = keeper->allocate_window(8 * kMiB, 0, 4096, "a tensor"); }
  ASSERT_EQ(keeper->kept_bytes(), 8 * kMiB);
  c10::DataPtr smaller = keeper->allocate_window(4 * kMiB, 0, 4096, "a tensor");  // 2x: waste
  c10::DataPtr larger = keeper->allocate_window(10 * kMiB, 0, 4096, "a tensor");  // too small
  EXPECT_EQ(keeper->reuses(), 0u);
  c10::DataPtr close_enough = keeper->allocate_window(7 * kMiB, 0, 4096, "a tensor");
  EXPECT_EQ(keeper->reuses(), 1u);
}

TEST(RecycledBlocks, WhenFullTheOldestGoAndSmallOrLateBlocksAreFreed) {
  auto keeper = std::make_shared<pool::RecycledBlocks>(10 * kMiB);
  std::vector<uintptr_t> blocks;
  {
    std::vector<c10::DataPtr> held;
    for (int i = 0; i < 3; ++i) {
      held.push_back(keeper->allocate_window(4 * kMiB, 0, 4096, "a tensor"));
      blocks.push_back(block_of(held.back(), 0));
    }
  }  // dropped in order: the first one no longer fits under the capacity
  EXPECT_EQ(keeper->kept_bytes(), 8 * kMiB);
  c10::DataPtr a = keeper->allocate_window(4 * kMiB, 0, 4096, "a tensor");
  c10::DataPtr b = keeper->allocate_window(4 * kMiB, 0, 4096, "a tensor");
  EXPECT_EQ((std::set<uintptr_t>{block_of(a, 0), block_of(b, 0)}),
            (std::set<uintptr_t>{blocks[1], blocks[2]}));
  { c10::DataPtr small = keeper->allocate_window(kMiB, 0, 4096, "a tensor"); }
  EXPECT_EQ(keeper->kept_bytes(), 0u);  // below 2 MiB: malloc's business
  { c10::DataPtr huge = keeper->allocate_window(12 * kMiB, 0, 4096, "a tensor"); }
  EXPECT_EQ(keeper->kept_bytes(), 0u);  // larger than the capacity
}

TEST(RecycledBlocks, CloseFreesWhatIsKeptAndBlocksOutliveTheirKeeper) {
  auto keeper = std::make_shared<pool::RecycledBlocks>(64 * kMiB);
  { c10::DataPtr data = keeper->allocate_window(4 * kMiB, 0, 4096, "a tensor"); }
  c10::DataPtr late = keeper->allocate_window(6 * kMiB, 0, 4096, "a tensor");
  keeper->close();
  EXPECT_EQ(keeper->kept_bytes(), 0u);
  std::weak_ptr<pool::RecycledBlocks> watch = keeper;
  keeper.reset();
  EXPECT_FALSE(watch.expired());  // the live block keeps it
  static_cast<char*>(late.get())[6 * kMiB - 1] = 1;
  late.clear();  // given back after close: freed
  EXPECT_TRUE(watch.expired());
}

TEST(RecycledBlocks, BlocksComeBackFromAnyThread) {
  auto keeper = std::make_shared<pool::RecycledBlocks>(16 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([keeper, t] {
      for (int i = 0; i < 200; ++i) {
        c10::DataPtr data = keeper->allocate_window((2 + (i + t) % 3) * kMiB, 64, 4096, "a tensor");
        static_cast<char*>(data.get())[0] = static_cast<char>(i);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(keeper->kept_bytes(), 16 * kMiB);
  EXPECT_GT(keeper->reuses(), 0u);
}

}  // namespace
}  // namespace instanttensor
