// UTF-8 validation of header text.
#pragma once

#include <cstdint>

namespace instanttensor::format {

// Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF), as Rust's from_utf8, over
// `n` bytes at `s`. Pure; any thread.
bool is_valid_utf8(const unsigned char* s, uint64_t n);

}  // namespace instanttensor::format
