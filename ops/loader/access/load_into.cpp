#include "loader/access/load_into.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/ScopeExit.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "format/torch_dtype.h"
#include "loader/reads/read_tags.h"
#include "loader/transfer/device_stage.h"
#include "loader/transfer/staging_stream.h"
#include "loader/transfer/storage_views.h"
#include "plan/memory_plan.h"
#include "pool/host_buffer.h"

namespace instanttensor::loader {

namespace {

bool congruent_for_direct(const io::IoSetup& io, const format::IndexedTensor& t, uint8_t* to) {
  const uint64_t block = io.alignment();
  return reinterpret_cast<uintptr_t>(to) % block == t.file_offset % block &&
         (t.file_offset + t.nbytes) / block * block > plan::round_up(t.file_offset, block);
}

// Submits the bytes of `t` into `to` (host memory the caller keeps alive until `tag` is done):
// O_DIRECT for the whole blocks of a congruent destination, the edges through the page cache
// (reading a partial block directly would write outside the destination); else buffered.
void submit_into_host(ReadScheduler& reads, io::IoSetup& io, const format::IndexedTensor& t,
                      uint8_t* to, uint64_t tag) {
  const uint64_t begin = t.file_offset, end = t.file_offset + t.nbytes;
  if (!io.direct() || !congruent_for_direct(io, t, to)) {
    reads.submit(t.file_index, plan::align_range(begin, t.nbytes, 1), to, tag, /*buffered=*/true);
    return;
  }
  const uint64_t block = io.alignment();
  const uint64_t middle_begin = plan::round_up(begin, block), middle_end = end / block * block;
  if (middle_begin > begin) {
    reads.submit(t.file_index, plan::align_range(begin, middle_begin - begin, 1), to, tag,
                 /*buffered=*/true);
  }
  reads.submit(t.file_index, plan::align_range(middle_begin, middle_end - middle_begin, 1),
               to + (middle_begin - begin), tag);
  if (end > middle_end) {
    reads.submit(t.file_index, plan::align_range(middle_end, end - middle_end, 1),
                 to + (middle_end - begin), tag, /*buffered=*/true);
  }
}

// For an error unwinding: none of `tags`' reads may still land (they write into the caller's
// memory, or temporaries about to be freed).
void settle_all(ReadScheduler& reads, const std::vector<std::pair<uint64_t, const Fill*>>& tags) {
  for (const auto& [tag, fill] : tags) reads.settle(tag);  // a done tag: forgotten only
}

// Waits for every tag (reads must not outlive this call: they write into the caller's memory),
// then throws the first failure.
void wait_all(ReadScheduler& reads, const format::Checkpoint& checkpoint,
              const std::vector<std::pair<uint64_t, const Fill*>>& tags) {
  std::optional<Error> first;
  try {
    for (const auto& [tag, fill] : tags) {
      auto failure = reads.wait_for(tag);
      if (failure && !first) {
        first =
            read_failure_error(*failure, checkpoint.path_of(*fill->source), fill->source->name());
      }
    }
  } catch (...) {
    settle_all(reads, tags);
    if (first) throw *first;  // the first error stands
    throw;
  }
  if (first) throw *first;
}

// Where one destination's bytes go: its own (contiguous) bytes, a temporary, or a stand-in.
struct Target {
  const format::IndexedTensor* source;
  uint8_t* to;
};

// Accelerator destinations (or any, when staging is forced): reads land in the staging ring in
// slices and are copied into the destination on the loader's stream, through the same staging
// stream as the loader's shares.
void fill_through_staging(const std::vector<Target>& targets, c10::Device device,
                          const format::Checkpoint& checkpoint, io::IoSetup& io,
                          ReadScheduler& reads, uint64_t chunk_size, uint64_t staging_bytes,
                          uint64_t& sequence, Stats& stats) {
  const uint64_t block = std::max<uint64_t>(io.alignment(), 64);
  // Two slices fit at once, whatever the read widening, so reads and copies overlap.
  const uint64_t slice = plan::staging_slice_bytes(chunk_size, staging_bytes, block);
  DeviceStage stage(device, staging_bytes, block, 0, plan::staging_ring_min_bytes(slice));
  auto close_stage = c10::make_scope_exit([&stage, &stats] {
    try {
      std::string memory = stage.staging().staging_memory();
      if (!memory.empty()) stats.staging = std::move(memory);
      stats.staging_bytes = std::max(stats.staging_bytes, stage.staging().allocated_bytes());
    } catch (...) {
      // Only statistics: the close below matters.
    }
    stage.close();
  });
  c10::DeviceGuard guard(device);
  // Work already queued on the consumer's stream may still read the old values.
  CopyFence::after(stage.streams().consumer()).block(stage.streams().loader(), "load_into_start");
  StagingStream stream(stage, reads, slice);
  std::deque<const format::IndexedTensor*> sources;  // of the waiting slices, in order
  std::optional<Error> failed;
  CopyFence last;
  auto land_oldest = [&] {
    const format::IndexedTensor& source = *sources.front();
    sources.pop_front();
    auto failure = reads.wait_for(stream.oldest_tag());
    if (failure && !failed) {
      failed = read_failure_error(*failure, checkpoint.path_of(source), source.name());
    }
    if (failed) {
      stream.drop_oldest();  // nothing more is copied; the remaining reads are only waited for
    } else {
      last = stream.copy_oldest();
    }
  };
  // Reads still in flight write into the staging ring: wait for them before it is freed.
  auto drain = c10::make_scope_exit([&] {
    while (stream.waiting() > 0) {
      reads.settle(stream.oldest_tag());  // noexcept: this runs while an error unwinds
      stream.drop_oldest();
    }
  });
  for (const Target& target : targets) {
    if (failed) break;
    const auto& t = *target.source;
    for (uint64_t done = 0; done < t.nbytes && !failed; done += slice) {
      uint64_t nbytes = std::min(slice, t.nbytes - done);
      auto range = plan::align_range(t.file_offset + done, nbytes, io.alignment());
      const uint64_t tag = read_tags::load_into(sequence++);
      while (!failed && !stream.submit(t.file_index, range, target.to + done, tag)) {
        // No room without a wait: queue the copies of the reads already done first, so the
        // copy engine has work while the host waits; then free the oldest copied slice if a
        // worker is idle for want of room; else wait for a read while any is in flight (the
        // copies may finish meanwhile); only then for the oldest copy. The same order as the
        // loader's passes (ReadPass::wait_until_landed).
        if (stream.waiting() > 0 && reads.done(stream.oldest_tag())) {
          land_oldest();
          continue;
        }
        stream.copy_ready();  // reads done behind a slow one: copied, their room freed
        if (stream.idle_reader_waits_for_room()) {
          stream.wait_oldest_copy();
        } else if (reads.in_flight() > 0) {
          reads.wait_one();
        } else if (!stream.wait_oldest_copy()) {
          if (stream.waiting() == 0) {
            throw Error(ErrorKind::Io, checkpoint.path_of(t), t.name(),
                        "load_into: a staging slice does not fit the staging ring");
          }
          land_oldest();
        }
      }
      if (!failed) sources.push_back(&t);
    }
  }
  while (stream.waiting() > 0) land_oldest();
  if (failed) throw *failed;
  last.block(stage.streams().consumer(), "load_into_done");
  stream.release_all();  // every copy has finished
}

}  // namespace

void fill_destinations(const std::vector<Fill>& fills, const format::Checkpoint& checkpoint,
                       io::IoSetup& io, ReadScheduler& reads, uint64_t staged_read_bytes,
                       uint64_t staging_bytes, bool force_staging, Stats& stats) {
  // Last, on every path: after the waits below, nothing of this call is in flight.
  auto release = c10::make_scope_exit([&] { reads.release_idle_files(); });
  uint64_t sequence = 0;
  std::vector<std::pair<uint64_t, const Fill*>> host_tags;
  std::vector<std::pair<c10::DataPtr, const Fill*>> temporaries;
  std::map<std::pair<int, int>, std::vector<Target>> staged;  // by device (the CPU: bounced)
  std::vector<std::pair<at::Tensor, const Fill*>> device_stand_ins;
  try {
    for (const auto& fill : fills) {
      const auto& t = *fill.source;
      const at::Tensor& dest = fill.destination;
      if (t.nbytes == 0) continue;
      uint8_t* to = nullptr;
      if (dest.is_contiguous()) {
        to = static_cast<uint8_t*>(dest.data_ptr());
      } else if (dest.is_cpu()) {
        temporaries.emplace_back(pool::allocate_host(t.nbytes, false, "a load_into temporary"),
                                 &fill);
        to = static_cast<uint8_t*>(temporaries.back().first.get());
      } else {
        // A contiguous stand-in on the device, copied into the destination afterwards.
        device_stand_ins.emplace_back(at::empty(dest.sizes(), dest.options()), &fill);
        to = static_cast<uint8_t*>(device_stand_ins.back().first.data_ptr());
      }
      auto device = dest.device();
      std::pair<int, int> key{static_cast<int>(device.type()), device.index()};
      if (force_staging || !dest.is_cpu()) {
        staged[key].push_back({&t, to});
      } else if (io.direct() && !congruent_for_direct(io, t, to)) {
        // Cold and not block-congruent: O_DIRECT through the (host) staging ring, then one copy
        // into the destination; buffered reads would leave the pace to the kernel's readahead.
        staged[key].push_back({&t, to});
      } else {
        uint64_t tag = read_tags::load_into(sequence++);
        host_tags.emplace_back(tag, &fill);
        submit_into_host(reads, io, t, to, tag);
      }
    }
  } catch (...) {
    settle_all(reads, host_tags);  // the first error stands
    throw;
  }
  wait_all(reads, checkpoint, host_tags);
  for (const auto& [key, targets] : staged) {
    c10::Device device(static_cast<c10::DeviceType>(key.first),
                       static_cast<c10::DeviceIndex>(key.second));
    fill_through_staging(targets, device, checkpoint, io, reads, staged_read_bytes, staging_bytes,
                         sequence, stats);
  }
  for (auto& [memory, fill] : temporaries) {
    const auto& t = *fill->source;
    auto storage = make_storage(std::move(memory), t.nbytes);
    fill->destination.copy_(tensor_over(std::move(storage), fill->destination.scalar_type(),
                                        fill->destination.sizes().vec()));
  }
  for (const auto& [stand_in, fill] : device_stand_ins) fill->destination.copy_(stand_in);
  // Bytes written in place since open must not have gone into a destination.
  std::vector<bool> checked(checkpoint.files().size(), false);
  for (const auto& fill : fills) {
    if (checked[fill.source->file_index]) continue;
    checked[fill.source->file_index] = true;
    checkpoint.check_unchanged(fill.source->file_index, fill.source->name());
  }
  stats.tensors_loaded += fills.size();
}

}  // namespace instanttensor::loader
