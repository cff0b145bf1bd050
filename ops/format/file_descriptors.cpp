#include "format/file_descriptors.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "instanttensor/error.h"

namespace instanttensor::format {

FileDescriptors::FileDescriptors(const std::vector<CheckpointFile>& files) : files_(files) {}

FileDescriptors::~FileDescriptors() { close_all(); }

void FileDescriptors::adopt(size_t index, int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    if (index >= fds_.size()) {
      fds_.resize(index + 1, -1);
      in_use_.resize(index + 1, false);
    }
    idle_.push_back(index);
  } catch (...) {
    ::close(fd);
    throw;
  }
  fds_[index] = fd;
  trim_idle();
}

int FileDescriptors::acquire(size_t index) {
  const CheckpointFile& file = files_.at(index);
  std::lock_guard<std::mutex> lock(mutex_);
  if (index >= fds_.size()) {
    fds_.resize(files_.size(), -1);
    in_use_.resize(files_.size(), false);
  }
  if (in_use_[index]) return fds_[index];
  struct stat st {};
  if (fds_[index] >= 0) {
    // Idle since its last use: the path must still name it, as for a descriptor opened anew.
    if (::stat(file.path.c_str(), &st) != 0) throw_reopen_failed(file, "", errno, "stat'ed again");
    if (!same_contents(file, st)) throw_changed_since_open(file, "", st);
    idle_.erase(std::find(idle_.begin(), idle_.end(), index));
  } else {
    const int fd = open_for_reading(file.path, &st);
    if (fd < 0) throw_reopen_failed(file, "", errno, "opened again");
    if (!same_contents(file, st)) {
      ::close(fd);
      throw_changed_since_open(file, "", st);
    }
    fds_[index] = fd;
  }
  in_use_[index] = true;
  in_use_count_ += 1;
  trim_idle();
  return fds_[index];
}

void FileDescriptors::release(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index >= fds_.size() || !in_use_[index]) return;
  in_use_[index] = false;
  in_use_count_ -= 1;
  idle_.push_back(index);
  trim_idle();
}

bool FileDescriptors::in_use(size_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return index < in_use_.size() && in_use_[index];
}

void FileDescriptors::close_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int& fd : fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  std::fill(in_use_.begin(), in_use_.end(), false);
  in_use_count_ = 0;
  idle_.clear();
}

struct stat FileDescriptors::stat_now(size_t index, const std::string& tensor) const {
  const CheckpointFile& file = files_.at(index);
  struct stat st {};
  std::lock_guard<std::mutex> lock(mutex_);
  if (index < in_use_.size() && in_use_[index]) {
    if (::fstat(fds_[index], &st) != 0) throw system_error(errno, file.path, "cannot stat");
    return st;
  }
  if (::stat(file.path.c_str(), &st) != 0)
    throw_reopen_failed(file, tensor, errno, "stat'ed again");
  if (st.st_dev != file.device || st.st_ino != file.inode)
    throw_changed_since_open(file, tensor, st);
  return st;
}

void FileDescriptors::trim_idle() {
  while (!idle_.empty() && idle_.size() + in_use_count_ > kOpenKept) {
    int& fd = fds_[idle_.front()];
    ::close(fd);
    fd = -1;
    idle_.pop_front();
  }
}

}  // namespace instanttensor::format
