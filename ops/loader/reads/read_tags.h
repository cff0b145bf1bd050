// One namespace for the tags of reads in a ReadScheduler shared by every part of a loader: read
// groups of the pass, rank shares, random access and load_into. A tag's top bits say whose read
// it is, so a failure found while waiting for one part's read is routed to the right part.
#pragma once

#include <cstdint>

namespace instanttensor::loader::read_tags {

constexpr uint64_t kLoadIntoBit = 1ull << 61;
constexpr uint64_t kShareBit = 1ull << 62;
constexpr uint64_t kRandomAccessBit = 1ull << 63;
constexpr uint64_t kKindBits = kLoadIntoBit | kShareBit | kRandomAccessBit;

// The whole-group read of read group `index` of the pass (index < 2^61).
constexpr uint64_t group(uint64_t index) { return index; }
// The `sequence`-th rank share of the pass.
constexpr uint64_t share(uint64_t sequence) { return kShareBit | sequence; }
// The `sequence`-th read of one load_into call.
constexpr uint64_t load_into(uint64_t sequence) { return kLoadIntoBit | sequence; }
// The one random-access read in flight (random access is synchronous and serialized).
constexpr uint64_t kRandomAccess = kRandomAccessBit;

constexpr bool is_group(uint64_t tag) { return (tag & kKindBits) == 0; }
constexpr bool is_share(uint64_t tag) { return (tag & kKindBits) == kShareBit; }
// Reads of the pass (groups and shares), as opposed to random access and load_into.
constexpr bool of_the_pass(uint64_t tag) { return is_group(tag) || is_share(tag); }

}  // namespace instanttensor::loader::read_tags
