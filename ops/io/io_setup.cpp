#include "io/io_setup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "format/checkpoint_file.h"
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
  set_up(backend_names);
}

IoSetup::IoSetup(const std::vector<std::string>& backend_names,
                 const format::Checkpoint& checkpoint)
    : checkpoint_(&checkpoint) {
  for (const auto& file : checkpoint.files()) {
    files_.push_back(FileToRead{file.path, -1, file.size});
  }
  set_up(backend_names);
}

int IoSetup::read_fd(size_t index) const {
  if (!direct_[index]) return buffered_fd(index);
  if (direct_fds_[index] < 0) direct_fds_[index] = open_direct_again(index);
  return direct_fds_[index];
}

int IoSetup::open_direct_again(size_t index) const {
  const std::string& path = files_[index].path;
  DirectIoAlignment alignment;
  struct stat st {};
  int fd = open_direct(path, &alignment, &st);
  if (fd < 0) {
    const int error = errno;
    if (checkpoint_) {
      // Refused (EINVAL) by what now sits at the path, another file or a pipe, is its change.
      const auto& validated = checkpoint_->files()[index];
      if (::stat(path.c_str(), &st) == 0 && !format::same_contents(validated, st)) {
        format::throw_changed_since_open(validated, "", st);
      }
      format::throw_reopen_failed(validated, "", error, "opened again for O_DIRECT reads");
    }
    throw system_error(error, path, "cannot be opened again for O_DIRECT reads");
  }
  if (checkpoint_) {
    // The file validated, as the buffered descriptors are (format::FileDescriptors): a file
    // replaced by rename, deleted or rewritten since the open is refused, not read.
    const auto& validated = checkpoint_->files()[index];
    if (!format::same_contents(validated, st)) {
      ::close(fd);
      format::throw_changed_since_open(validated, "", st);
    }
  }
  return fd;
}

bool IoSetup::buffered_in_use(size_t index) const {
  return checkpoint_ ? checkpoint_->descriptor_in_use(index) : true;
}

void IoSetup::release(size_t index, bool buffered) {
  if (direct_fds_[index] >= 0) {
    ::close(direct_fds_[index]);
    direct_fds_[index] = -1;
  }
  if (buffered && checkpoint_) checkpoint_->release_descriptor(index);
}

int IoSetup::buffered_fd(size_t index) const {
  return checkpoint_ ? checkpoint_->descriptor(index) : files_[index].buffered_fd;
}

void IoSetup::set_up(const std::vector<std::string>& backend_names) {
  bool want_direct = false;
  uint64_t total = 0;
  double resident = 0;
  for (size_t index = 0; index < files_.size(); ++index) {
    const uint64_t size = files_[index].size;
    total += size;
    if (checkpoint_) {
      format::ScopedDescriptor file(*checkpoint_, index);
      resident += resident_fraction(file.fd(), size) * static_cast<double>(size);
    } else {
      resident += resident_fraction(files_[index].buffered_fd, size) * static_cast<double>(size);
    }
  }
  mostly_resident_ = total == 0 || resident / static_cast<double>(total) >= kMostlyResident;
  for (const auto& name : backend_names) {
    if (name == "mmap") {
      try {
        mapping_ = checkpoint_ ? std::make_shared<const MappedFiles>(*checkpoint_)
                               : std::make_shared<const MappedFiles>(files_);
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
  direct_.assign(files_.size(), false);
  direct_fds_.assign(files_.size(), -1);
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
    ::close(fd);  // one file at a time: N shards never hold N descriptors at once
    direct_[index] = true;
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
  // The probe reads the largest file (the first of that size) through its buffered descriptor.
  std::vector<FileToRead> files = files_;
  size_t largest = 0;
  for (size_t index = 0; index < files.size(); ++index) {
    if (files[index].size > files[largest].size) largest = index;
  }
  std::optional<format::ScopedDescriptor> held;
  if (!files.empty() && checkpoint_) {
    held.emplace(*checkpoint_, largest);  // released after the probe unless in use before
    files[largest].buffered_fd = held->fd();
  }
  auto choice = measure_read_methods(files);
  held.reset();
  if (choice.direct) {
    read_direct();
    describe();
  }
  add_note(choice.reason);
}

IoSetup::~IoSetup() { close(); }

void IoSetup::close() {
  for (int& fd : direct_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  mapping_.reset();  // views handed out keep their own reference
}

int IoSetup::reads_at_once(int threads, int depth) const {
  if (uring_ && !mapping_) return std::max(depth, 1);
  return std::max(threads, 1);
}

std::unique_ptr<ReadBackend> IoSetup::start_backend(int threads, int depth, uint32_t idle_spin_us) {
  if (mapping_) {
    if (threads == 0) {
      return make_inline_reader([mapping = mapping_](const ReadRequest& request) {
        return copy_from_mapping(*mapping, request);
      });
    }
    return make_mapped_copy_pool(mapping_, threads, idle_spin_us);
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
  return make_pread_pool(threads, idle_spin_us);
}

}  // namespace instanttensor::io
