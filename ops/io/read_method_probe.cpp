#include "io/read_method_probe.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#include "io/direct_io.h"
#include "io/memory_advice.h"

namespace instanttensor::io {

namespace {

constexpr int kProbeReads = 4;
constexpr uint64_t kHugePageBytes = 2ull << 20;

std::string rate_text(double bytes_per_second) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB/s", bytes_per_second / 1e9);
  return text;
}

std::string mib_text(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

#ifdef INSTANTTENSOR_TESTING_HOOKS
// Test-only, in a library built with INSTANTTENSOR_TESTING_HOOKS:
// INSTANTTENSOR_TESTING_READ_RATES=<O_DIRECT GB/s>,<buffered GB/s> (read at each timing)
// replaces the rates just measured, both methods still read, so a test on a disk where buffered
// reads win can have O_DIRECT win and check the load that follows. The reason says so.
std::optional<ReadMethodChoice> testing_choice(uint64_t probe_bytes) {
  const char* testing = std::getenv("INSTANTTENSOR_TESTING_READ_RATES");
  double direct = 0;
  double buffered = 0;
  if (!testing || std::sscanf(testing, "%lf,%lf", &direct, &buffered) != 2) return std::nullopt;
  auto choice = decide_read_method(direct * 1e9, buffered * 1e9, probe_bytes);
  choice.reason += ", rates set by INSTANTTENSOR_TESTING_READ_RATES";
  return choice;
}
#else
std::optional<ReadMethodChoice> testing_choice(uint64_t) { return std::nullopt; }
#endif

// Reads [offset, offset + length) of `fd` into `into` as kProbeReads concurrent preads; the
// rate in bytes per second, or 0 when a read failed or came short (a truncated file, EIO).
double timed_read(int fd, uint64_t offset, uint64_t length, uint8_t* into) {
  const uint64_t share = length / kProbeReads;
  std::atomic<bool> failed{false};  // any reader may meet a short read
  auto read_share = [&, fd](int index) {
    uint64_t done = 0;
    const uint64_t begin = offset + static_cast<uint64_t>(index) * share;
    while (done < share) {
      ssize_t got =
          ::pread(fd, into + index * share + done, share - done, static_cast<off_t>(begin + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        failed = true;
        return;
      }
      done += static_cast<uint64_t>(got);
    }
  };
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> readers;
  try {
    for (int index = 1; index < kProbeReads; ++index) readers.emplace_back(read_share, index);
  } catch (...) {
    failed = true;  // no thread: the rate would not be the pool's
  }
  read_share(0);
  for (auto& reader : readers) reader.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failed || seconds <= 0) return 0;
  return static_cast<double>(share * kProbeReads) / seconds;
}

struct FreeAligned {
  void operator()(uint8_t* p) const { std::free(p); }
};

}  // namespace

ReadMethodChoice decide_read_method(double direct_rate, double buffered_rate,
                                    uint64_t probe_bytes) {
  ReadMethodChoice choice;
  choice.direct_rate = direct_rate;
  choice.buffered_rate = buffered_rate;
  const std::string over = " over " + mib_text(probe_bytes) + " each";
  if (direct_rate <= 0 && buffered_rate <= 0) {
    choice.reason = "auto: buffered, neither read method could be timed";
  } else if (direct_rate <= 0) {
    choice.reason = "auto: buffered " + rate_text(buffered_rate) + ", O_DIRECT could not be timed";
  } else if (buffered_rate <= 0) {
    choice.direct = true;
    choice.reason = "auto: O_DIRECT " + rate_text(direct_rate) + ", buffered could not be timed";
  } else if (direct_rate >= kDirectMargin * buffered_rate) {
    choice.direct = true;
    choice.reason = "auto: O_DIRECT " + rate_text(direct_rate) + " against buffered " +
                    rate_text(buffered_rate) + over;
  } else {
    choice.reason = "auto: buffered " + rate_text(buffered_rate) + " against O_DIRECT " +
                    rate_text(direct_rate) + over;
  }
  return choice;
}

uint64_t probe_bytes_for(uint64_t checkpoint_bytes) {
  return std::clamp(checkpoint_bytes / 64, kLeastProbeBytes, kProbeBytes);
}

ReadMethodChoice measure_read_methods(const std::vector<FileToRead>& files, uint64_t probe_bytes,
                                      uint64_t smallest_timed) {
  uint64_t total = 0;
  const FileToRead* largest = nullptr;
  for (const auto& file : files) {
    total += file.size;
    if (!largest || file.size > largest->size) largest = &file;
  }
  if (probe_bytes == 0) probe_bytes = probe_bytes_for(total);
  probe_bytes = std::max<uint64_t>(probe_bytes / (kProbeReads * 4096) * (kProbeReads * 4096),
                                   kProbeReads * 4096);
  ReadMethodChoice unmeasured;
  if (total < smallest_timed || !largest || largest->size < 2 * probe_bytes) {
    unmeasured.reason = "auto: buffered, not timed (under " +
                        mib_text(std::max(smallest_timed, 2 * probe_bytes)) + ")";
    return unmeasured;
  }
  void* memory = nullptr;
  if (::posix_memalign(&memory, kHugePageBytes, probe_bytes) != 0) {
    unmeasured.reason = "auto: buffered, no memory to time the read methods";
    return unmeasured;
  }
  std::unique_ptr<uint8_t, FreeAligned> buffer(static_cast<uint8_t*>(memory));
  // Faulted before either timing: the first method would otherwise pay for fresh pages (here up
  // to a second per 256 MiB under load) and the second would not. In 2 MiB pages where the
  // kernel grants them: faulting 4 KiB pages cost about 1 ms per MiB in this project's VM.
  (void)advise(memory, probe_bytes, MADV_HUGEPAGE, "the read method probe's buffer");
  std::memset(buffer.get(), 0, probe_bytes);
  double direct_rate = 0;
  DirectIoAlignment alignment;
  int direct_fd = open_direct(largest->path, &alignment);
  // Probe offsets and shares are multiples of 4 KiB: any alignment up to it is honoured.
  if (direct_fd >= 0) {
    if (alignment.offset_alignment <= 4096 && alignment.memory_alignment <= 4096) {
      direct_rate = timed_read(direct_fd, 0, probe_bytes, buffer.get());
    }
    ::close(direct_fd);
  }
  // Buffered on the next bytes: timing the same bytes again would let the storage's own cache
  // flatter the second method.
  double buffered_rate = timed_read(largest->buffered_fd, probe_bytes, probe_bytes, buffer.get());
  if (auto testing = testing_choice(probe_bytes)) return *testing;
  return decide_read_method(direct_rate, buffered_rate, probe_bytes);
}

}  // namespace instanttensor::io
