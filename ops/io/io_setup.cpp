#include "io/io_setup.h"

#include <unistd.h>

#include "instanttensor/error.h"
#include "io/direct_io.h"

namespace instanttensor::io {

namespace {
// Above this share of pages already cached, buffered reads beat O_DIRECT (which would go to
// the device again).
constexpr double kMostlyResident = 0.5;
}  // namespace

IoSetup::IoSetup(const std::vector<std::string>& backend_names,
                 const std::vector<FileToRead>& files) {
  bool want_direct = false;
  std::string skipped;
  uint64_t total = 0;
  double resident = 0;
  for (const auto& file : files) {
    total += file.size;
    resident += resident_fraction(file.buffered_fd, file.size) * static_cast<double>(file.size);
  }
  mostly_resident_ = total == 0 || resident / static_cast<double>(total) >= kMostlyResident;
  for (const auto& name : backend_names) {
    if (name == "mmap") {
      try {
        mapping_ = std::make_shared<const MappedFiles>(files);
      } catch (const Error& e) {
        skipped += std::string(" mmap (") + e.what() + ")";
        continue;
      }
      break;
    }
    if (name == "auto") {
      want_direct = !mostly_resident_;
    } else {
      want_direct = name == "direct" || name == "uring";
      uring_ = name == "uring" || name == "uring_buffered";
    }
    break;
  }
  int refused = 0;
  for (const auto& file : files) {
    buffered_fds_.push_back(file.buffered_fd);
    int fd = -1;
    DirectIoAlignment alignment;
    if (want_direct) fd = open_direct(file.path, &alignment);
    if (fd >= 0) {
      owned_fds_.push_back(fd);
      read_fds_.push_back(fd);
      if (alignment.offset_alignment > alignment_) alignment_ = alignment.offset_alignment;
    } else {
      refused += want_direct ? 1 : 0;
      read_fds_.push_back(file.buffered_fd);
    }
  }
  description_ = mapping_
                     ? "mmap"
                     : std::string(uring_ ? "io_uring" : "pread") + (direct() ? "+O_DIRECT" : "");
  if (refused > 0)
    description_ += " (" + std::to_string(refused) + " file(s) buffered: O_DIRECT refused)";
  if (!skipped.empty()) description_ += " (skipped:" + skipped + ")";
}

IoSetup::~IoSetup() { close(); }

void IoSetup::close() {
  for (int fd : owned_fds_) ::close(fd);
  owned_fds_.clear();
  mapping_.reset();  // views handed out keep their own reference
}

std::unique_ptr<ReadBackend> IoSetup::start_backend(int threads, int depth) {
  if (mapping_) {
    if (threads == 0) {
      return make_inline_reader([mapping = mapping_](const ReadRequest& request) {
        return copy_from_mapping(*mapping, request);
      });
    }
    return make_mapped_copy_pool(mapping_, threads);
  }
  if (uring_) {
    try {
      return make_uring_backend(static_cast<unsigned>(depth));
    } catch (const Error& e) {
      // Blocked in many containers (seccomp EPERM, ENOSYS): the pread pool does the same job.
      description_ = std::string("pread") + (direct() ? "+O_DIRECT" : "") +
                     " (io_uring fallback: " + e.what() + ")";
    }
  }
  if (threads == 0) return make_inline_reader(pread_request);
  return make_pread_pool(threads);
}

}  // namespace instanttensor::io
