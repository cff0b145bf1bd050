#include "format/dtype.h"

namespace instanttensor::format {

namespace {
struct DtypeInfo {
  Dtype dtype;
  const char* name;
  uint32_t bits;
};

constexpr DtypeInfo kDtypes[kDtypeCount] = {
    {Dtype::BOOL, "BOOL", 8},
    {Dtype::U8, "U8", 8},
    {Dtype::I8, "I8", 8},
    {Dtype::F8_E5M2, "F8_E5M2", 8},
    {Dtype::F8_E4M3, "F8_E4M3", 8},
    {Dtype::F8_E8M0, "F8_E8M0", 8},
    {Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {Dtype::I16, "I16", 16},
    {Dtype::U16, "U16", 16},
    {Dtype::F16, "F16", 16},
    {Dtype::BF16, "BF16", 16},
    {Dtype::I32, "I32", 32},
    {Dtype::U32, "U32", 32},
    {Dtype::F32, "F32", 32},
    {Dtype::C64, "C64", 64},
    {Dtype::F64, "F64", 64},
    {Dtype::I64, "I64", 64},
    {Dtype::U64, "U64", 64},
    {Dtype::F4, "F4", 4},
    {Dtype::F6_E2M3, "F6_E2M3", 6},
    {Dtype::F6_E3M2, "F6_E3M2", 6},
};
}  // namespace

const char* dtype_name(Dtype dtype) noexcept { return kDtypes[static_cast<int>(dtype)].name; }

std::optional<Dtype> dtype_from_name(const std::string& name) noexcept {
  for (const auto& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

uint32_t dtype_bits(Dtype dtype) noexcept { return kDtypes[static_cast<int>(dtype)].bits; }

uint32_t dtype_alignment(Dtype dtype) noexcept {
  uint32_t bits = dtype_bits(dtype);
  return bits >= 8 ? bits / 8 : 1;
}

int dtype_writer_rank(Dtype dtype) noexcept {
  // Ascending order of the reference implementation's enum (observed in its files' layout).
  static constexpr Dtype kOrder[kDtypeCount] = {
      Dtype::BOOL,        Dtype::F4,      Dtype::F6_E2M3, Dtype::F6_E3M2, Dtype::U8,
      Dtype::I8,          Dtype::F8_E5M2, Dtype::F8_E4M3, Dtype::F8_E8M0, Dtype::F8_E4M3FNUZ,
      Dtype::F8_E5M2FNUZ, Dtype::I16,     Dtype::U16,     Dtype::F16,     Dtype::BF16,
      Dtype::I32,         Dtype::U32,     Dtype::F32,     Dtype::C64,     Dtype::F64,
      Dtype::I64,         Dtype::U64};
  for (int rank = 0; rank < kDtypeCount; ++rank) {
    if (kOrder[rank] == dtype) return rank;
  }
  return 0;
}

}  // namespace instanttensor::format
