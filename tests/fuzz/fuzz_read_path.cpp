// libFuzzer: arbitrary bytes written to an in-memory file, opened as a checkpoint, planned and
// read through the pread pool into memory, as the loader does (minus torch).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "instanttensor/error.h"
#include "io/read_backend.h"
#include "plan/read_plan.h"

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
    if (plan.total_bytes <= size) {  // validated: the data lies inside the file
      std::vector<uint8_t> buffer(plan.total_bytes + 1);
      auto backend = io::make_pread_pool(2);
      uint64_t at = 0;
      for (const auto& group : plan.groups) {
        auto range = plan::align_range(group.file_offset, group.length, 1);
        for (const auto& piece : plan::split_into_pieces(range, 4096)) {
          backend->submit(io::ReadRequest{checkpoint.files()[0].fd, range.begin + piece.offset,
                                          piece.length, buffer.data() + at + piece.offset, 0,
                                          piece.required});
        }
        at += group.length;
      }
      while (backend->in_flight() > 0) {
        auto done = backend->wait_completion();
        if (done.error != 0 || done.truncated) __builtin_trap();  // nothing changed the file
      }
    } else {
      __builtin_trap();  // a validated plan may never exceed the file
    }
  } catch (const Error&) {
  }
  ::close(fd);
  return 0;
}
