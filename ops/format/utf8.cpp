#include "format/utf8.h"

namespace instanttensor::format {

bool is_valid_utf8(const unsigned char* s, uint64_t n) {
  uint64_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra;
    uint32_t min_cp;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      extra = 1, min_cp = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, min_cp = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, min_cp = 0x10000, cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i <= static_cast<uint64_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

}  // namespace instanttensor::format
