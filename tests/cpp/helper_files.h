// Helpers for tests: temporary folders and hand-made safetensors bytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace instanttensor::testing {

// A fresh folder under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Whether a test that finds no file lease must fail rather than skip: CI runs as root on a local
// filesystem, where leases are granted (INSTANTTENSOR_REQUIRE_LEASES=1 in scripts/test.sh), so
// there a missing lease is a bug, not the platform.
inline bool leases_required() {
  const char* v = std::getenv("INSTANTTENSOR_REQUIRE_LEASES");
  return v != nullptr && std::string(v) == "1";
}

// The 8-byte little-endian length prefix.
std::string le64(uint64_t value);
// prefix(len(header)) + header + data.
std::string safetensors_bytes(const std::string& header, const std::string& data);
void write_bytes(const std::string& path, const std::string& bytes);
std::string read_bytes(const std::string& path);
// Open fds of this process (counts /proc/self/fd entries).
int open_fd_count();
// Threads of this process (from /proc/self/status).
int thread_count();

// The read backend named by stats().backend, without the note a host iteration over views of the
// page cache adds (" (iteration: views of the page cache (...))").
inline std::string read_backend(const std::string& backend) {
  return backend.substr(0, backend.find(" (iteration: "));
}
// Whether iteration hands out views of the page cache (nothing read through the backend).
inline bool iterates_views(const std::string& backend) {
  return backend.find("(iteration: views of the page cache") != std::string::npos;
}

}  // namespace instanttensor::testing
