// load_into: filling tensors the caller already owns, in place, in one pass over the bytes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "instanttensor/instanttensor.h"
#include "io/io_setup.h"
#include "loader/reads/read_scheduler.h"

namespace instanttensor::loader {

// A destination matched to its source tensor in the checkpoint.
struct Fill {
  const format::IndexedTensor* source = nullptr;
  at::Tensor destination;
};

struct MatchedDestinations {
  std::vector<Fill> fills;  // in storage order
  LoadIntoResult result;    // names left out on either side (strict=false)
};

// Matches `names[i]` -> `tensors[i]` to the `selected` tensors (checkpoint indices, sorted) and
// checks everything before a byte is written: each destination is a strided tensor with
// storage whose elements do not overlap (not expanded), of the file's dtype and torch shape
// (Error(Argument) naming the tensor and both sides); no two destinations share bytes
// (Argument naming both); and, when `strict`, every name is on both sides (Error(Key) listing
// what is missing on each side). Consumer thread.
MatchedDestinations match_destinations(const format::Checkpoint& checkpoint,
                                       const std::vector<size_t>& selected,
                                       const std::vector<std::string>& names,
                                       const std::vector<at::Tensor>& tensors, bool strict);

// Executes fills, one pass over the bytes into each CPU destination (non-contiguous ones: into
// a temporary, then copied). Read direct (`direct`, or `auto` timing O_DIRECT faster): a
// destination whose address agrees with the file offset modulo the block gets O_DIRECT straight
// into its whole blocks (edges buffered), any other goes through the host staging ring (O_DIRECT,
// then one copy). Otherwise: buffered reads straight into the destination (mmap backend: copies
// from its mapping), spread over the read workers. Accelerator destinations (or every one, with
// `force_staging`) stream through a pinned staging ring of `staging_bytes` into the destination's
// bytes on the loader's stream, in reads of at most `staged_read_bytes` (the loader's choice for a
// staged pass: PassPlan::staged_read_bytes): the loader allocates no device memory. Returns when
// every destination holds its bytes (device copies finished). A read failure or a file changed
// since open throws Error naming the file and tensor; destinations filled before it keep their new
// bytes. Consumer thread; `reads` may carry other tags meanwhile.
void fill_destinations(const std::vector<Fill>& fills, const format::Checkpoint& checkpoint,
                       io::IoSetup& io, ReadScheduler& reads, uint64_t staged_read_bytes,
                       uint64_t staging_bytes, bool force_staging, Stats& stats);

}  // namespace instanttensor::loader
