// Owned copies of views of a file's mapping, for PageCacheViews: into fresh pages placed by
// userfaultfd (large views), or into heap memory (small ones).
#pragma once

#include <cstdint>
#include <memory>

namespace instanttensor::loader {

// Copies `nbytes` of `from` (a view of the mapping, as the consumer may have written it) into
// `to`, memory from io::map_untouched_pages: whole pages placed by userfaultfd on torch's
// threads, whatever it could not place (refused, a source page past a truncation) and the
// partial last page by the kernel's copy (io/fault_free_copy.h) once the pages are ordinary
// memory again. Returns the bytes copied from the start before the first source byte that could
// not be read (a file truncated under its mapping; never a SIGBUS): `nbytes` when all were.
// Consumer thread (it runs at::parallel_for).
uint64_t copy_into_untouched(uint8_t* to, const uint8_t* from, uint64_t nbytes);

// `nbytes` of heap memory on a 64-byte boundary (torch's CPU alignment), freed with the last
// reference; std::bad_alloc if none. Any thread.
std::shared_ptr<uint8_t> heap_bytes(uint64_t nbytes);

}  // namespace instanttensor::loader
