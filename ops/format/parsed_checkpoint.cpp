#include "format/parsed_checkpoint.h"

#include <algorithm>

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

thread_local std::unique_ptr<Checkpoint> kept;

}  // namespace

void keep_for_next_open(std::unique_ptr<Checkpoint> checkpoint) { kept = std::move(checkpoint); }

std::unique_ptr<Checkpoint> take_kept_checkpoint(std::vector<std::string> paths) {
  std::unique_ptr<Checkpoint> checkpoint = std::move(kept);
  if (!checkpoint || checkpoint->files().size() != paths.size()) return nullptr;
  std::sort(paths.begin(), paths.end());  // as the checkpoint sorted its files
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& file = checkpoint->files()[i];
    if (file.path != paths[i] || !still_at_its_path(file)) return nullptr;
  }
  try {
    checkpoint->check_unchanged();  // the open fds too (size, mtime)
  } catch (const Error&) {
    return nullptr;
  }
  return checkpoint;
}

}  // namespace instanttensor::format
