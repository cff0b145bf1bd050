// Advice to the kernel about a range of memory (madvise), checked in one place: every madvise
// of the loader but the read-ahead's MADV_WILLNEED and MADV_POPULATE_READ, which are reads
// (io/page_cache_read_ahead: a slice refused is left to the consumer's faults and not counted
// as populated). Advice is a
// hint: a kernel may lack it (EINVAL), refuse it for that memory (locked pages refuse
// MADV_DONTNEED), or be short of memory for it (EAGAIN). A refusal never fails a load (the bytes
// are right either way; only resident memory or speed differ), so it is counted for the whole
// process and the first one described, for stats()["advice_refused"] and the debug line.
// Any thread.
#pragma once

#include <cstdint>
#include <string>

namespace instanttensor::io {

// madvise(start, length, advice) for `purpose` (a few words: "the read ring's huge pages");
// whether the kernel took it. A refusal is counted, never thrown. `start` page-aligned, as
// madvise requires (an unaligned one is refused and counted like any other refusal).
bool advise(void* start, uint64_t length, int advice, const char* purpose) noexcept;

// Refusals in this process so far (monotonic).
uint64_t advice_refusals() noexcept;

// The first refusal in this process, "MADV_DONTNEED of 4096 bytes (the page cache views'
// unmapping): Invalid argument"; "" while none.
std::string first_advice_refusal();

}  // namespace instanttensor::io
