// Storages over memory the loader manages, and tensors over them built without dispatch, so
// every dtype (float4, float8, unsigned) is handled the same way on every device.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace instanttensor::loader {

// A non-resizable storage of `nbytes` over `data` (which it owns if the DataPtr does).
c10::intrusive_ptr<c10::StorageImpl> make_storage(c10::DataPtr data, uint64_t nbytes);

// A storage of `nbytes` over memory handed to the consumer as its own (`data` owns it): on the
// CPU resizable through torch's CPU allocator, as a tensor torch made is, so resize_ works
// (it moves the bytes into torch's memory and frees ours); elsewhere as make_storage.
c10::intrusive_ptr<c10::StorageImpl> make_owned_storage(c10::DataPtr data, uint64_t nbytes);

// A CPU DataPtr at `data`, memory that `owner` keeps alive (a file mapping, a ring block): the
// DataPtr holds `owner` until it is dropped.
c10::DataPtr data_kept_by(void* data, std::shared_ptr<const void> owner);

// A non-resizable CPU storage of `nbytes` at `data`, memory that `owner` keeps alive (a file
// mapping): the storage holds `owner` until its last tensor is gone.
c10::intrusive_ptr<c10::StorageImpl> make_storage_kept_by(uint8_t* data, uint64_t nbytes,
                                                          std::shared_ptr<const void> owner);

// A contiguous tensor of `dtype` and `shape` over `storage`, on the storage's device.
at::Tensor tensor_over(c10::intrusive_ptr<c10::StorageImpl> storage, c10::ScalarType dtype,
                       const std::vector<int64_t>& shape);

// A flat uint8 tensor viewing [data, data + nbytes) on `device`, owning nothing: the caller keeps
// the memory alive while the view is in use (collectives, device copies).
at::Tensor byte_view(uint8_t* data, uint64_t nbytes, c10::Device device);

}  // namespace instanttensor::loader
