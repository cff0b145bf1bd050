#include "format/checkpoint_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

int64_t nanoseconds(const struct timespec& at) {
  return static_cast<int64_t>(at.tv_sec) * 1'000'000'000 + at.tv_nsec;
}

// Whether `st` differs from `file` in size or modification time (an in-place change of the file
// validated, seen through a descriptor of it or its path); `what` then says how.
bool changed_in_place(const CheckpointFile& file, const struct stat& st, std::string* what) {
  if (static_cast<uint64_t>(st.st_size) != file.size) {
    *what = "size " + std::to_string(file.size) + " -> " + std::to_string(st.st_size);
    return true;
  }
  if (nanoseconds(st.st_mtim) != file.mtime_ns) {
    *what = "same size, modified in place";
    return true;
  }
  return false;
}

}  // namespace

void record_identity(CheckpointFile& file, const struct stat& st) {
  file.size = static_cast<uint64_t>(st.st_size);
  file.device = st.st_dev;
  file.inode = st.st_ino;
  file.mtime_ns = nanoseconds(st.st_mtim);
  file.ctime_ns = nanoseconds(st.st_ctim);
}

bool same_file(const CheckpointFile& file, const struct stat& st) {
  return st.st_dev == file.device && st.st_ino == file.inode &&
         static_cast<uint64_t>(st.st_size) == file.size &&
         nanoseconds(st.st_mtim) == file.mtime_ns && nanoseconds(st.st_ctim) == file.ctime_ns;
}

bool same_contents(const CheckpointFile& file, const struct stat& st) {
  std::string unused;
  return st.st_dev == file.device && st.st_ino == file.inode &&
         !changed_in_place(file, st, &unused);
}

void throw_changed_since_open(const CheckpointFile& file, const std::string& tensor,
                              const struct stat& st) {
  std::string how = "its path names another file";
  if (st.st_dev == file.device && st.st_ino == file.inode) changed_in_place(file, st, &how);
  throw Error(ErrorKind::Io, file.path, tensor, "file changed since it was opened (" + how + ")");
}

void throw_reopen_failed(const CheckpointFile& file, const std::string& tensor, int error,
                         const std::string& taken) {
  const std::string reason = errno_message(error);
  switch (error) {
    case ENOENT:
    case ENOTDIR:
    case EACCES:
    case EPERM:
    case ELOOP:
    case ESTALE:
      throw Error(ErrorKind::Io, file.path, tensor,
                  "file changed since it was opened (its path cannot be opened: " + reason + ")");
    default:
      throw Error(ErrorKind::Io, file.path, tensor, "cannot be " + taken + ": " + reason);
  }
}

bool still_at_its_path(const CheckpointFile& file) {
  struct stat st {};
  return ::stat(file.path.c_str(), &st) == 0 && same_file(file, st);
}

int open_for_reading(const std::string& path, struct stat* st, int extra_flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return -1;
  if (::fstat(fd, st) != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  // A regular file: back to ordinary blocking reads (anything else is refused by the caller).
  if (S_ISREG(st->st_mode)) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace instanttensor::format
