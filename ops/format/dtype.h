// The 22 element types of the safetensors format, torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace instanttensor::format {

enum class Dtype : uint8_t {
  BOOL,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64,
  F4,
  F6_E2M3,
  F6_E3M2
};

constexpr int kDtypeCount = 22;

// The exact, case-sensitive name used in headers ("BF16", ...).
const char* dtype_name(Dtype dtype) noexcept;

// Parses a header dtype name; nullopt for anything not among the 22 names.
std::optional<Dtype> dtype_from_name(const std::string& name) noexcept;

// Bits per element (4 for F4, 6 for F6_*); the format stores sub-byte types packed.
uint32_t dtype_bits(Dtype dtype) noexcept;

// Natural alignment in bytes (1 for sub-byte types).
uint32_t dtype_alignment(Dtype dtype) noexcept;

// The reference writer orders data by this rank, descending (its dtype enum order: wider types
// rank higher), so every tensor is naturally aligned and files come out byte-identical.
int dtype_writer_rank(Dtype dtype) noexcept;

}  // namespace instanttensor::format
