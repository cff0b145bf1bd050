#include "format/header.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/header_layout.h"
#include "format/utf8.h"
#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

using nlohmann::json;

// Builds the entries straight from the parser's events: no DOM, so time is linear in the header
// and memory a small multiple of it (the callback DOM parser walked the root object at every
// nested object's end: quadratic in the number of tensors). Any rule broken throws Error(Format).
class HeaderSax : public nlohmann::json_sax<json> {
 public:
  HeaderSax(const std::string& file, FileHeader& header) : file_(file), header_(header) {}

  bool null() override { return scalar("null"); }
  bool boolean(bool value) override { return scalar(value ? "true" : "false"); }
  bool number_integer(number_integer_t value) override { return scalar(std::to_string(value)); }
  bool number_unsigned(number_unsigned_t value) override {
    if (depth_ == 3 && (field_ == Field::Shape || field_ == Field::Offsets) && skip_ == 0) {
      auto& list = field_ == Field::Shape ? entry_.shape : offsets_;
      if (field_ == Field::Shape && list.size() == kMaxDims) {
        fail(file_, entry_.name, kRule,
             "'shape' has more than " + std::to_string(kMaxDims) + " dimensions");
      }
      list.push_back(value);
      return true;
    }
    return scalar(std::to_string(value));
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool string(string_t& value) override {
    if (depth_ == 2 && in_metadata_) {
      header_.metadata[metadata_key_] = std::move(value);
      return true;
    }
    if (depth_ == 2 && field_ == Field::Dtype && skip_ == 0) {
      auto dtype = dtype_from_name(value);
      if (!dtype) fail(file_, entry_.name, kRule, "unknown dtype '" + value + "'");
      entry_.dtype = *dtype;
      return true;
    }
    return scalar("\"" + value + "\"");
  }
  bool binary(binary_t&) override { return scalar("binary"); }

  bool start_object(std::size_t) override { return open('{'); }
  bool start_array(std::size_t) override { return open('['); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& key) override {
    if (skip_ > 0) return true;
    if ((depth_ == 1 || (depth_ == 2 && in_metadata_)) && ++entries_ > kMaxHeaderEntries) {
      fail(file_, "", kRule,
           "more than " + std::to_string(kMaxHeaderEntries) +
               " entries (tensors and metadata keys)");
    }
    if (depth_ == 1) {
      if (key == "__metadata__") {
        if (seen_metadata_) fail(file_, "", kRule, "'__metadata__' appears twice");
        seen_metadata_ = true;
        top_key_ = TopKey::Metadata;
      } else {
        top_key_ = TopKey::Tensor;
        entry_ = TensorEntry();
        entry_.name = std::move(key);
        seen_fields_ = 0;
        offsets_.clear();
      }
      return true;
    }
    if (depth_ == 2 && in_metadata_) {
      metadata_key_ = std::move(key);
      return true;
    }
    if (depth_ == 2) {  // a field of a tensor entry
      field_ = key == "dtype"          ? Field::Dtype
               : key == "shape"        ? Field::Shape
               : key == "data_offsets" ? Field::Offsets
                                       : Field::Other;
      if (field_ != Field::Other) {
        unsigned bit = 1u << static_cast<unsigned>(field_);
        if (seen_fields_ & bit)
          fail(file_, entry_.name, kRule, "field '" + key + "' appears twice");
        seen_fields_ |= bit;
      }
    }
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(file_, "", kRule, std::string("header is not valid JSON: ") + e.what());
  }

 private:
  enum class TopKey { Metadata, Tensor };
  enum class Field : unsigned { Dtype = 0, Shape = 1, Offsets = 2, Other = 3 };
  static constexpr const char* kRule = "InvalidHeaderDeserialization";
  // Not a rule of the reference reader (it has no cap): a bound on what one entry may cost.
  static constexpr size_t kMaxDims = 1024;

  // A value that is not an object or array, where the grammar of the header wants something.
  bool scalar(const std::string& text) {
    if (skip_ > 0) return true;
    if (depth_ == 0) fail(file_, "", kRule, "header is not a JSON object");
    if (depth_ == 1) {
      if (top_key_ == TopKey::Metadata) {
        if (text == "null") return true;  // as the reference: no metadata
        fail(file_, "", kRule, "'__metadata__' is not an object");
      }
      fail(file_, entry_.name, kRule, "entry is not a JSON object");
    }
    if (depth_ == 2 && in_metadata_) {
      fail(file_, "", kRule, "'__metadata__' value of '" + metadata_key_ + "' is not a string");
    }
    if (depth_ == 2) return field_value();
    // depth 3: an element of shape or data_offsets that is not a non-negative integer
    fail(file_, entry_.name, kRule,
         std::string(field_ == Field::Shape ? "'shape'" : "'data_offsets'") + " holds " + text +
             ", not a non-negative integer");
  }

  // The value of a known field has the wrong type (an unknown field's value is skipped).
  bool field_value() {
    switch (field_) {
      case Field::Dtype:
        fail(file_, entry_.name, kRule, "'dtype' is not a string");
      case Field::Shape:
        fail(file_, entry_.name, kRule, "'shape' is not an array");
      case Field::Offsets:
        fail(file_, entry_.name, kRule, "'data_offsets' is not an array of exactly two integers");
      case Field::Other:
        break;  // unknown fields are ignored, as the reference does
    }
    return true;
  }

  bool open(char kind) {
    if (skip_ > 0) {
      ++skip_;
      return true;
    }
    if (depth_ == 0) {
      if (kind != '{') fail(file_, "", kRule, "header is not a JSON object");
    } else if (depth_ == 1) {
      if (top_key_ == TopKey::Metadata) {
        if (kind != '{') fail(file_, "", kRule, "'__metadata__' is not an object");
        in_metadata_ = true;
        header_.has_metadata = true;
      } else if (kind != '{') {
        fail(file_, entry_.name, kRule, "entry is not a JSON object");
      }
    } else if (depth_ == 2) {
      if (in_metadata_) {
        fail(file_, "", kRule, "'__metadata__' value of '" + metadata_key_ + "' is not a string");
      }
      if (field_ == Field::Other) {
        skip_ = 1;  // an unknown field's value, whatever it holds
        return true;
      }
      if (kind == '{' || field_ == Field::Dtype) field_value();
    } else {  // depth 3: inside shape or data_offsets
      fail(file_, entry_.name, kRule,
           std::string(field_ == Field::Shape ? "'shape'" : "'data_offsets'") + " holds " +
               (kind == '{' ? "an object" : "an array") + ", not a non-negative integer");
    }
    ++depth_;
    return true;
  }

  bool close() {
    if (skip_ > 0) {
      --skip_;
      return true;
    }
    --depth_;
    if (depth_ == 1 && in_metadata_) {
      in_metadata_ = false;
    } else if (depth_ == 1) {
      finish_entry();
    } else if (depth_ == 2 && field_ == Field::Offsets) {
      if (offsets_.size() != 2) {
        fail(file_, entry_.name, kRule, "'data_offsets' is not an array of exactly two integers");
      }
    }
    return true;
  }

  void finish_entry() {
    for (auto [field, name] : {std::pair{Field::Dtype, "dtype"},
                               {Field::Shape, "shape"},
                               {Field::Offsets, "data_offsets"}}) {
      if (!(seen_fields_ & (1u << static_cast<unsigned>(field)))) {
        fail(file_, entry_.name, kRule, std::string("missing field '") + name + "'");
      }
    }
    entry_.data_begin = offsets_[0];
    entry_.data_end = offsets_[1];
    header_.tensors.push_back(std::move(entry_));
  }

  const std::string& file_;
  FileHeader& header_;
  int depth_ = 0;
  int skip_ = 0;  // nesting inside an ignored value
  TopKey top_key_ = TopKey::Tensor;
  bool seen_metadata_ = false;
  size_t entries_ = 0;  // top-level keys and metadata keys so far
  bool in_metadata_ = false;
  std::string metadata_key_;
  TensorEntry entry_;
  Field field_ = Field::Other;
  unsigned seen_fields_ = 0;
  std::vector<uint64_t> offsets_;
};

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
  // nlohmann's lexer skips a byte-order mark; the reference reader's JSON parser does not.
  if (length >= 3 && std::memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
    fail(file_name, "", "InvalidHeaderDeserialization",
         "header starts with a UTF-8 byte-order mark");
  }
  FileHeader header;
  header.header_length = length;
  HeaderSax sax(file_name, header);
  json::sax_parse(text, text + length, &sax, json::input_format_t::json, /*strict=*/true);
  check_layout(file_name, header, file_size);
  return header;
}

}  // namespace instanttensor::format
