// A range of a private file mapping turned into private copies of its pages (a kept view frozen
// before a writer changes the file) and back to the file's pages. Torch-free; any thread, on
// ranges no other thread changes meanwhile.
#pragma once

#include <cstdint>

namespace instanttensor::io {

// Private copies of [start, start + length) at the same addresses, in one step: a reader sees
// the file's page or its copy, never a hole. Bytes at or past `available` (a file's end) are
// zeros, never read (no SIGBUS). False when no copy could be made (nothing changed then).
bool replace_by_copies(uint8_t* start, uint64_t length, uint64_t available) noexcept;

// [offset, offset + length) of the mapping at `mapping_start` (of the file `fd`, from its first
// byte) maps the file's pages again. Where no mapping can be had (vm.max_map_count, memory, an
// offset off a page), the copies there stay and take the file's bytes of now through pread
// (zeros past its end), so a later read of the range still gets the file's bytes; a change of
// the file after that shows in its mtime. The pread is disk I/O under the caller's locks: the
// fallback of a failure only.
void restore_file_pages(uint8_t* mapping_start, int fd, uint64_t offset, uint64_t length) noexcept;

}  // namespace instanttensor::io
