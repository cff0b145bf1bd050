#include "format/durable_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

std::atomic<uint64_t> next_temporary{0};

// "<path>.tmp-instanttensor-<pid>-<n>": unique per call in this process, and the pid tells a
// later save whether its writer is still alive.
std::string unique_temporary(const std::string& path) {
  return temporary_prefix(path) + std::to_string(::getpid()) + "-" +
         std::to_string(next_temporary.fetch_add(1));
}

std::string folder_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Removes "<path>.tmp-instanttensor-<pid>[-<n>]" files whose process no longer exists: what a
// killed save_file left (also the single-pid names of earlier versions).
void remove_dead_temporaries(const std::string& path, const std::string& folder) {
  std::string name_prefix = temporary_prefix(path.substr(path.rfind('/') + 1));
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;  // the create below reports what is wrong with the folder
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name.compare(0, name_prefix.size(), name_prefix) != 0) continue;
    char* end = nullptr;
    long pid = std::strtol(name.c_str() + name_prefix.size(), &end, 10);
    if (pid <= 0 || (*end != '\0' && *end != '-')) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still alive
    ::unlinkat(::dirfd(dir), name.c_str(), 0);
  }
  ::closedir(dir);
}

void sync_folder(const std::string& folder, const std::string& path) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw system_error(errno, path, "cannot open the folder to sync it");
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  // Some file systems cannot sync a folder (EINVAL); the rename itself was done.
  if (rc != 0 && saved != EINVAL) throw system_error(saved, path, "cannot sync the folder");
}

}  // namespace

std::string temporary_prefix(const std::string& path) { return path + ".tmp-instanttensor-"; }

DurableFile::DurableFile(std::string path, bool unnamed)
    : path_(std::move(path)), folder_(folder_of(path_)) {
  remove_dead_temporaries(path_, folder_);
  if (unnamed) {
#ifdef O_TMPFILE
    fd_ = ::open(folder_.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    // Unsupported here (old kernel: EISDIR; file system: EOPNOTSUPP): a named temporary.
    if (fd_ < 0 && errno != EISDIR && errno != EOPNOTSUPP && errno != EINVAL) {
      throw system_error(errno, path_, "cannot create a file in its folder");
    }
#endif
  }
  if (fd_ < 0) {
    temp_path_ = unique_temporary(path_);
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      int saved = errno;
      temp_path_.clear();
      throw system_error(saved, path_, "cannot create");
    }
  }
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void DurableFile::write(const void* data, uint64_t count) {
  const char* p = static_cast<const char*>(data);
  while (count > 0) {
    ssize_t n = ::write(fd_, p, count < (1u << 30) ? count : (1u << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw system_error(errno, path_, "write failed");
    p += n;
    count -= static_cast<uint64_t>(n);
  }
}

void DurableFile::commit() {
  if (::fsync(fd_) != 0) throw system_error(errno, path_, "cannot sync the data to storage");
  if (temp_path_.empty()) {
    // Name the unnamed file: a link to a unique temporary name, renamed over the path (linkat
    // cannot replace an existing file). A crash between the two leaves a complete temporary,
    // which the next save to this path removes.
    std::string linked = unique_temporary(path_);
    std::string self = "/proc/self/fd/" + std::to_string(fd_);
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, linked.c_str(), AT_SYMLINK_FOLLOW) != 0 &&
        ::linkat(fd_, "", AT_FDCWD, linked.c_str(), AT_EMPTY_PATH) != 0) {
      throw system_error(errno, path_, "cannot give the written file a name");
    }
    temp_path_ = linked;
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw system_error(errno, path_, "close failed");
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw system_error(errno, path_, "cannot rename the temporary file into place");
  }
  committed_ = true;
  sync_folder(folder_, path_);
}

}  // namespace instanttensor::format
