// The ATen operators the loader and the tests use on the simulated device. Copies are queued on
// the current stream of the device involved and run later on its worker; non_blocking=false
// waits for them. Anything else (dtype conversion, strided copies) goes through the host.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <torch/library.h>

#include <cstring>
#include <optional>

#include "sim_allocators.h"
#include "sim_runtime.h"

namespace simdev {

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

// Makes `device` current for the allocator while alive (the allocator serves the current
// device), then restores the caller's.
struct OnDevice {
  explicit OnDevice(std::optional<at::Device> device) : previous(current_device()) {
    if (device && device->has_index()) set_current_device(device->index());
  }
  ~OnDevice() { set_current_device(previous); }
  c10::DeviceIndex previous;
};

c10::DeviceIndex index_of(const at::Tensor& t) {
  return t.device().has_index() ? t.device().index() : current_device();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device,
                               std::optional<bool>, std::optional<at::MemoryFormat> format) {
  OnDevice on(device);
  return at::detail::empty_generic(size, device_allocator_instance(),
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   dtype.value_or(at::get_default_dtype_as_scalartype()), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device> device, std::optional<bool>) {
  OnDevice on(device);
  return at::detail::empty_strided_generic(size, stride, device_allocator_instance(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           dtype.value_or(at::get_default_dtype_as_scalartype()));
}

bool plain(const at::Tensor& a, const at::Tensor& b) {
  return a.is_contiguous() && b.is_contiguous() && a.scalar_type() == b.scalar_type() &&
         a.sizes() == b.sizes();
}

// The host copy of a device tensor of any strides: its storage bytes read back (waiting), then
// viewed with the same sizes and strides.
at::Tensor to_host(const at::Tensor& src) {
  auto& s = stream_of(current_stream(index_of(src)));
  auto storage_bytes = src.storage().nbytes();
  auto host = at::empty({static_cast<int64_t>(storage_bytes)}, at::kByte);
  const void* from = src.storage().data();
  void* to = host.data_ptr();
  const c10::DeviceIndex device = index_of(src);
  if (storage_bytes > 0) {
    const DeviceRange source = device_range(real(from), storage_bytes);
    s.wait_for(s.enqueue([=] {
      engine_move(device, Direction::DeviceToHost, storage_bytes, [&] {
        touch_live(source, DeviceRange{}, [&] { std::memcpy(to, source.host, storage_bytes); });
      });
    }));
  }
  return host.view(src.scalar_type()).as_strided(src.sizes(), src.strides(), src.storage_offset());
}

// Queues a copy of `nbytes` on `stream`; waits unless `async`. `keep` holds host memory alive
// until the copy ran (torch's pinned allocators record an event for the same purpose). Copies
// between the host and `device` go through its copy engine (the timing model); others
// (`engine` empty: device to device, a fill) run on the stream's worker like a kernel.
void queued_copy(Stream& s, void* to, const void* from, size_t nbytes, bool async,
                 c10::Storage keep, c10::DeviceIndex device = 0,
                 std::optional<Direction> engine = std::nullopt) {
  if (nbytes == 0) return;
  // The device sides: the destination but for a read-back, the source but for an upload or a
  // fill (whose host bytes `keep` holds).
  const bool to_device = engine != Direction::DeviceToHost;
  const bool from_device =
      engine ? *engine == Direction::DeviceToHost : !(keep && keep.device().is_cpu());
  // Noted now, checked when the copy runs: memory freed in between (a free ordered before the
  // copy) is counted as a stale access and left alone.
  const DeviceRange to_range = to_device ? device_range(to, nbytes) : DeviceRange{};
  const DeviceRange from_range = from_device ? device_range(from, nbytes) : DeviceRange{};
  uint64_t sequence = s.enqueue([=, keep = std::move(keep)] {
    auto move = [&] {
      touch_live(to_range, from_range, [&] {
        if (moves(nbytes)) std::memcpy(to, from, nbytes);
      });
    };
    if (engine) {
      engine_move(device, *engine, nbytes, move);
    } else {
      move();
    }
  });
  if (!async) s.wait_for(sequence);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const at::Tensor& src = self;
  bool src_device = src.device().type() == kType;
  bool dst_device = dst.device().type() == kType;
  if (src_device && dst_device) {
    TORCH_CHECK(index_of(src) == index_of(dst), "simdev: copies between devices go via the host");
    if (plain(src, dst)) {
      // Device to device: asynchronous w.r.t. the host, as on CUDA.
      queued_copy(stream_of(current_stream(index_of(dst))), real(dst.data_ptr()),
                  real(src.data_ptr()), dst.nbytes(), /*async=*/true, c10::Storage());
      return dst;
    }
    return dst.copy_(to_host(src).to(dst.scalar_type()).contiguous().to(dst.device()));
  }
  if (dst_device) {  // host -> device
    TORCH_CHECK(dst.is_contiguous(),
                "simdev: copies into strided device tensors are not simulated");
    at::Tensor host = plain(src, dst) ? src : src.to(dst.scalar_type()).expand_as(dst).contiguous();
    bool async = non_blocking && is_pinned(host.data_ptr());
    queued_copy(stream_of(current_stream(index_of(dst))), real(dst.data_ptr()), host.data_ptr(),
                dst.nbytes(), async, host.storage(), index_of(dst), Direction::HostToDevice);
    return dst;
  }
  // device -> host
  if (plain(src, dst)) {
    bool async = non_blocking && is_pinned(dst.data_ptr());
    queued_copy(stream_of(current_stream(index_of(src))), dst.data_ptr(), real(src.data_ptr()),
                dst.nbytes(), async, dst.storage(), index_of(src), Direction::DeviceToHost);
    return dst;
  }
  return dst.copy_(to_host(src));
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<at::MemoryFormat>) {
  auto* impl = self.unsafeGetTensorImpl();
  int64_t elements = c10::multiply_integers(size);
  uint64_t needed = (self.storage_offset() + elements) * self.element_size();
  if (needed > self.storage().nbytes()) {
    OnDevice on(self.device());
    c10::DataPtr fresh = device_allocator_instance()->allocate(needed);
    uint64_t old = self.storage().nbytes();
    if (old > 0) {
      auto& s = stream_of(current_stream(index_of(self)));
      void* to = real(fresh.get());
      const void* from = real(self.storage().data());
      s.wait_for(s.enqueue([=] { std::memcpy(to, from, old); }));
    }
    self.storage().set_data_ptr_noswap(std::move(fresh));
    self.storage().set_nbytes(needed);
  }
  impl->set_sizes_contiguous(size);
  return self;
}

at::Tensor& fill(at::Tensor& self, const at::Scalar& value) {
  auto host = at::empty(self.sizes(), self.options().device(at::kCPU)).fill_(value);
  TORCH_CHECK(self.is_contiguous(), "simdev: fill_ of strided device tensors is not simulated");
  queued_copy(stream_of(current_stream(index_of(self))), real(self.data_ptr()), host.data_ptr(),
              self.nbytes(), /*async=*/true, host.storage());
  return self;
}

at::Tensor& zero(at::Tensor& self) { return fill(self, 0); }

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Scalar local_scalar(const at::Tensor& self) { return to_host(self).item(); }

// Concatenation along the first dimension of contiguous tensors (how gathered control messages
// are joined before their one read back): a kernel on the current stream, as on CUDA.
at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  auto inputs = tensors.materialize();
  TORCH_CHECK(!inputs.empty(), "simdev: cat of no tensors");
  const at::Tensor& first = inputs[0];
  TORCH_CHECK(first.dim() > 0 && c10::maybe_wrap_dim(dim, first.dim()) == 0,
              "simdev: cat is simulated along the first dimension only");
  std::vector<int64_t> sizes(first.sizes().begin(), first.sizes().end());
  sizes[0] = 0;
  for (const at::Tensor& t : inputs) {
    TORCH_CHECK(t.is_contiguous() && t.scalar_type() == out.scalar_type() &&
                    t.dim() == first.dim() && t.sizes().slice(1) == first.sizes().slice(1) &&
                    t.device() == out.device() && !t.is_same(out),
                "simdev: cat is simulated for contiguous tensors of the output's dtype, device "
                "and trailing sizes, apart from the output");
    sizes[0] += t.size(0);
  }
  (resize)(out, sizes, std::nullopt);  // parenthesized: not at::resize by ADL
  auto& s = stream_of(current_stream(index_of(out)));
  uint8_t* to = static_cast<uint8_t*>(real(out.data_ptr()));
  for (const at::Tensor& t : inputs) {
    const void* from = real(t.data_ptr());
    size_t nbytes = t.nbytes();
    queued_copy(s, to, from, nbytes, /*async=*/true, t.storage());
    to += nbytes;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize);
  m.impl("fill_.Scalar", fill);
  m.impl("zero_", zero);
  m.impl("_local_scalar_dense", local_scalar);
  m.impl("cat.out", cat_out);
}

}  // namespace simdev
