// libFuzzer: arbitrary bytes written to an in-memory file, opened as a checkpoint, planned and
// read through the pread pool into memory, as the loader does (minus torch), with ranges widened
// to 1, 512 and 4096 bytes as O_DIRECT needs; every byte read is compared with the input.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "instanttensor/error.h"
#include "io/read_backend.h"
#include "plan/read_plan.h"

namespace {

// Reads every planned group with ranges widened to `alignment` (as O_DIRECT would: whole blocks,
// the last one possibly past end of file) and checks the wanted bytes against the input.
void read_and_compare(const instanttensor::format::Checkpoint& checkpoint,
                      const instanttensor::plan::ReadPlan& plan, const uint8_t* data, size_t size,
                      uint64_t alignment) {
  using namespace instanttensor;
  struct Landing {
    uint64_t file_offset, length;
    const uint8_t* wanted;
  };
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<Landing> landings;
  auto backend = io::make_pread_pool(2);
  for (const auto& group : plan.groups) {
    if (group.length == 0) continue;  // empty tensors only: nothing is read
    auto range = plan::align_range(group.file_offset, group.length, alignment);
    if (range.begin > group.file_offset || range.prefix != group.file_offset - range.begin ||
        range.span < range.prefix + group.length || range.begin % alignment != 0 ||
        range.span % alignment != 0) {
      __builtin_trap();  // the widened range must cover the wanted bytes on block boundaries
    }
    buffers.emplace_back(range.span + 1, 0xA5);
    uint8_t* dest = buffers.back().data();
    landings.push_back({group.file_offset, group.length, dest + range.prefix});
    for (const auto& piece : plan::split_into_pieces(range, 4 * alignment)) {
      backend->submit(io::ReadRequest{checkpoint.descriptor(0), range.begin + piece.offset,
                                      piece.length, dest + piece.offset, 0, piece.required});
    }
  }
  while (backend->in_flight() > 0) {
    auto done = backend->wait_completion();
    if (done.error != 0 || done.truncated) __builtin_trap();  // nothing changed the file
  }
  for (const auto& landing : landings) {
    if (landing.file_offset + landing.length > size) __builtin_trap();
    if (std::memcmp(landing.wanted, data + landing.file_offset, landing.length) != 0) {
      __builtin_trap();  // a byte read is not the byte in the file
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace instanttensor;
  int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    ssize_t n = ::write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  try {
    format::Checkpoint checkpoint({"/proc/self/fd/" + std::to_string(fd)});
    std::vector<size_t> all(checkpoint.tensors().size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    auto plan = plan::make_read_plan(checkpoint, all, 1 << 16);
    if (plan.total_bytes > size) __builtin_trap();  // a validated plan may never exceed the file
    for (uint64_t alignment : {uint64_t{1}, uint64_t{512}, uint64_t{4096}}) {
      read_and_compare(checkpoint, plan, data, size, alignment);
    }
  } catch (const Error&) {
  }
  ::close(fd);
  return 0;
}
