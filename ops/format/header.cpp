#include "format/header.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& file, const std::string& tensor, const std::string& rule,
                       const std::string& detail) {
  throw Error(ErrorKind::Format, file, tensor, rule + ": " + detail);
}

// Strict UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF), as Rust's from_utf8.
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

bool is_non_negative_integer(const json& value) { return value.is_number_unsigned(); }

TensorEntry parse_entry(const std::string& file, const std::string& name, const json& info) {
  const std::string rule = "InvalidHeaderDeserialization";
  if (!info.is_object()) fail(file, name, rule, "entry is not a JSON object");
  auto dtype_it = info.find("dtype");
  auto shape_it = info.find("shape");
  auto offsets_it = info.find("data_offsets");
  if (dtype_it == info.end()) fail(file, name, rule, "missing field 'dtype'");
  if (shape_it == info.end()) fail(file, name, rule, "missing field 'shape'");
  if (offsets_it == info.end()) fail(file, name, rule, "missing field 'data_offsets'");
  if (!dtype_it->is_string()) fail(file, name, rule, "'dtype' is not a string");
  auto dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype) fail(file, name, rule, "unknown dtype '" + dtype_it->get<std::string>() + "'");
  if (!shape_it->is_array()) fail(file, name, rule, "'shape' is not an array");
  TensorEntry entry;
  entry.name = name;
  entry.dtype = *dtype;
  for (const auto& dim : *shape_it) {
    if (!is_non_negative_integer(dim)) {
      fail(file, name, rule, "'shape' holds " + dim.dump() + ", not a non-negative integer");
    }
    entry.shape.push_back(dim.get<uint64_t>());
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2) {
    fail(file, name, rule, "'data_offsets' is not an array of exactly two integers");
  }
  for (const auto& offset : *offsets_it) {
    if (!is_non_negative_integer(offset)) {
      fail(file, name, rule,
           "'data_offsets' holds " + offset.dump() + ", not a non-negative integer");
    }
  }
  entry.data_begin = (*offsets_it)[0].get<uint64_t>();
  entry.data_end = (*offsets_it)[1].get<uint64_t>();
  return entry;
}

}  // namespace

uint64_t parse_length_prefix(const std::string& file_name, const uint8_t* prefix,
                             uint64_t prefix_size, uint64_t file_size) {
  if (prefix_size < 8 || file_size < 8) {
    fail(file_name, "", "HeaderTooSmall",
         "file has " + std::to_string(file_size) + " bytes, fewer than the 8-byte length prefix");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > kMaxHeaderBytes) {
    fail(file_name, "", "HeaderTooLarge",
         "header length " + std::to_string(n) + " exceeds the limit of " +
             std::to_string(kMaxHeaderBytes));
  }
  if (8 + n > file_size) {
    fail(file_name, "", "InvalidHeaderLength",
         "header length " + std::to_string(n) + " runs past the end of the " +
             std::to_string(file_size) + "-byte file");
  }
  return n;
}

FileHeader parse_header_json(const std::string& file_name, const char* text, uint64_t length,
                             uint64_t file_size) {
  if (!is_valid_utf8(reinterpret_cast<const unsigned char*>(text), length)) {
    fail(file_name, "", "InvalidHeader", "header is not valid UTF-8");
  }
  // JSON text never holds a raw NUL (not even inside strings), and nlohmann stops reading at one:
  // reject NUL padding here rather than let the parser take a prefix of the header.
  if (std::memchr(text, '\0', length) != nullptr) {
    fail(file_name, "", "InvalidHeaderDeserialization", "header holds a NUL byte (NUL padding?)");
  }
  // The callback sees every top-level key before nlohmann's object insert would let a second
  // definition silently replace the first.
  std::set<std::string> seen_keys;
  json::parser_callback_t reject_duplicates = [&](int depth, json::parse_event_t event,
                                                  json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!seen_keys.insert(key).second) {
        if (key == "__metadata__") {
          fail(file_name, "", "InvalidHeaderDeserialization", "'__metadata__' appears twice");
        }
        fail(file_name, key, "DuplicateTensorName", "the name is defined twice in the header");
      }
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text, text + length, reject_duplicates, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    fail(file_name, "", "InvalidHeaderDeserialization",
         std::string("header is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) {
    fail(file_name, "", "InvalidHeaderDeserialization", "header is not a JSON object");
  }

  FileHeader header;
  header.header_length = length;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) {
        fail(file_name, "", "InvalidHeaderDeserialization", "'__metadata__' is not an object");
      }
      header.has_metadata = true;
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          fail(file_name, "", "InvalidHeaderDeserialization",
               "'__metadata__' value of '" + m.key() + "' is not a string");
        }
        header.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_entry(file_name, it.key(), *it));
  }

  std::stable_sort(
      header.tensors.begin(), header.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
        return std::make_pair(a.data_begin, a.data_end) < std::make_pair(b.data_begin, b.data_end);
      });
  uint64_t start = 0;
  for (const auto& entry : header.tensors) {
    if (entry.data_begin != start || entry.data_end < entry.data_begin) {
      fail(file_name, entry.name, "InvalidOffset",
           "data_offsets [" + std::to_string(entry.data_begin) + ", " +
               std::to_string(entry.data_end) + "] do not continue at " + std::to_string(start) +
               " (gap, overlap or reversed range)");
    }
    start = entry.data_end;
    uint64_t elements = 1;
    for (uint64_t dim : entry.shape) {
      if (dim != 0 && elements > UINT64_MAX / dim) {
        fail(file_name, entry.name, "ValidationOverflow", "shape element count overflows");
      }
      elements *= dim;
    }
    uint64_t bits_per = dtype_bits(entry.dtype);
    if (elements > UINT64_MAX / bits_per) {
      fail(file_name, entry.name, "ValidationOverflow", "shape bit count overflows");
    }
    uint64_t bits = elements * bits_per;
    if (bits % 8 != 0) {
      fail(file_name, entry.name, "MisalignedSlice",
           std::to_string(elements) + " elements of " + dtype_name(entry.dtype) +
               " do not fill whole bytes");
    }
    if (entry.nbytes() != bits / 8) {
      fail(file_name, entry.name, "TensorInvalidInfo",
           "data_offsets span " + std::to_string(entry.nbytes()) + " bytes but shape x dtype is " +
               std::to_string(bits / 8) + " bytes");
    }
  }
  if (start + 8 + length != file_size) {
    fail(file_name, "", "MetadataIncompleteBuffer",
         "tensors cover " + std::to_string(start) + " data bytes, but the file holds " +
             std::to_string(file_size - 8 - length) + " (truncated file or trailing bytes)");
  }
  return header;
}

FileHeader read_file_header(int fd, const std::string& file_name, uint64_t file_size) {
  auto read_exact = [&](void* dest, uint64_t count, uint64_t offset) {
    uint64_t done = 0;
    while (done < count) {
      ssize_t got = ::pread(fd, static_cast<char*>(dest) + done, count - done, offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw system_error(errno, file_name, "reading the header failed");
      if (got == 0) {
        throw Error(ErrorKind::Io, file_name, "", "file shrank while its header was read");
      }
      done += static_cast<uint64_t>(got);
    }
  };
  uint8_t prefix[8] = {};
  uint64_t prefix_size = std::min<uint64_t>(8, file_size);
  read_exact(prefix, prefix_size, 0);
  uint64_t length = parse_length_prefix(file_name, prefix, prefix_size, file_size);
  std::string text(length, '\0');
  read_exact(text.data(), length, 8);
  return parse_header_json(file_name, text.data(), length, file_size);
}

}  // namespace instanttensor::format
