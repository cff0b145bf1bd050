// KeptViews' copy out: a view kept past its step copied into owned memory and its storage
// repointed, where it is neither leased nor copied where it is (kept_views.h).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "io/fault_free_copy.h"
#include "io/untouched_pages.h"
#include "loader/pass/kept_views.h"
#include "loader/pass/owned_copy.h"
#include "loader/reads/timing.h"
#include "loader/transfer/storage_views.h"

namespace instanttensor::loader {

bool KeptViews::make_owned(const HandedOutView& view, std::optional<Error>& error) noexcept {
  auto start = Clock::now();
  const auto& t = plan_.tensor_of_item(view.item);
  const std::string& path = plan_.checkpoint->files()[t.file_index].path;
  // A message that cannot be allocated is left unsaid rather than ending the process here.
  auto say = [&](ErrorKind kind, const char* what, const char* detail = "") noexcept {
    try {
      if (!error) error.emplace(kind, path, t.name(), std::string(what) + detail);
    } catch (...) {
    }
  };
  try {
    plan_.checkpoint->check_unchanged(t.file_index, t.name());
  } catch (const Error& e) {
    say(ErrorKind::Io, "the file changed while the tensor was held as a view of it: ", e.what());
  }
  bool owned = false;
  try {
    // Fresh pages filled as they are allocated (io/untouched_pages.h), two threads at once: a
    // memcpy into fresh memory pays a zeroed page per 4 KiB first (262 MB: 0.24 s on one
    // thread, 0.12 s on two, in torch's own allocator). A small view goes to the heap instead: a
    // mapping and a userfaultfd of its own cost more than its bytes. Either copy reads the view
    // (the consumer's in-place writes included) through the kernel: a page past the end of a
    // file truncated meanwhile stops it, never a SIGBUS.
    const bool small = t.nbytes < kLeasedViewMinBytes;
    std::shared_ptr<uint8_t> memory =
        small ? heap_bytes(t.nbytes) : io::map_untouched_pages(t.nbytes);
    uint8_t* to = memory.get();
    const uint64_t copied = small ? io::copy_without_faults(to, view.data, t.nbytes)
                                  : copy_into_untouched(to, view.data, t.nbytes);
    if (copied < t.nbytes) {
      std::memset(to + copied, 0, t.nbytes - copied);
      say(ErrorKind::Io,
          "the file shrank while the tensor was held as a view of it (bytes past its new end "
          "are zeros)");
    }
    // A pointer exported before (numpy, DLPack, data_ptr) still points into the mapping: it
    // stays mapped while the tensor lives, as the borrow ring keeps its block for such pointers.
    struct FreshKeepingTheMapping {
      std::shared_ptr<uint8_t> fresh;
      std::shared_ptr<const io::MappedFiles> mapping;
    };
    auto both = std::make_shared<FreshKeepingTheMapping>(
        FreshKeepingTheMapping{std::move(memory), mapping_});
    // Asked again right before the repoint: the copy took time.
    if (still_ours(view)) {
      view.storage->set_data_ptr_noswap(data_kept_by(to, std::move(both)));
      stats_.materializations += 1;
    }
    owned = true;
  } catch (...) {
    // No memory for it: it stays a view of the mapping (valid while the file is), reported.
    say(ErrorKind::OutOfMemory,
        "no memory to copy the tensor kept past its step; it stays a view of the file, which a "
        "change of the file reaches, until a later step can copy it");
  }
  stats_.copy_seconds += seconds_since(start);
  return owned;
}

}  // namespace instanttensor::loader
