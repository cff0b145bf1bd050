#include "io/io_setup.h"

#include <unistd.h>

#include "instanttensor/error.h"
#include "io/direct_io.h"
#include "io/read_method_probe.h"

namespace instanttensor::io {

namespace {
// Above this share of pages already cached, buffered reads beat O_DIRECT (which would go to
// the device again).
constexpr double kMostlyResident = 0.5;
}  // namespace

IoSetup::IoSetup(const std::vector<std::string>& backend_names,
                 const std::vector<FileToRead>& files)
    : files_(files) {
  bool want_direct = false;
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
        skipped_ += std::string(" mmap (") + e.what() + ")";
        continue;
      }
      break;
    }
    if (name == "auto") {
      cold_method_undecided_ = !mostly_resident_;  // buffered until choose_cold_read_method
    } else {
      want_direct = name == "direct" || name == "uring";
      uring_ = name == "uring" || name == "uring_buffered";
    }
    break;
  }
  for (const auto& file : files) {
    buffered_fds_.push_back(file.buffered_fd);
    read_fds_.push_back(file.buffered_fd);
  }
  if (want_direct) read_direct();
  describe();
}

void IoSetup::read_direct() {
  for (size_t index = 0; index < files_.size(); ++index) {
    DirectIoAlignment alignment;
    int fd = open_direct(files_[index].path, &alignment);
    if (fd < 0) {
      direct_refused_ += 1;  // this file stays buffered
      continue;
    }
    owned_fds_.push_back(fd);
    read_fds_[index] = fd;
    if (alignment.offset_alignment > alignment_) alignment_ = alignment.offset_alignment;
  }
}

void IoSetup::describe() {
  description_ = mapping_ ? "mmap" : std::string(uring_ ? "io_uring" : "pread");
  if (direct()) description_ += "+O_DIRECT";
  if (!uring_fallback_.empty()) description_ += " (io_uring fallback: " + uring_fallback_ + ")";
  if (direct_refused_ > 0) {
    description_ += " (" + std::to_string(direct_refused_) + " file(s) buffered: O_DIRECT refused)";
  }
  if (!skipped_.empty()) description_ += " (skipped:" + skipped_ + ")";
}

void IoSetup::choose_cold_read_method(bool time_them) {
  if (!cold_method_undecided_) return;
  cold_method_undecided_ = false;
  if (!time_them) {
    add_note("auto: buffered, the iteration reads through the page cache");
    return;
  }
  auto choice = measure_read_methods(files_);
  if (choice.direct) {
    read_direct();
    describe();
  }
  add_note(choice.reason);
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
      // Described afresh, so the refusals and skipped backends said before stay said.
      uring_ = false;
      uring_fallback_ = e.what();
      describe();
    }
  }
  if (threads == 0) return make_inline_reader(pread_request);
  return make_pread_pool(threads);
}

}  // namespace instanttensor::io
