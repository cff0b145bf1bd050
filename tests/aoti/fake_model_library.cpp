// A model library built by hand for the tests: the C ABI of an AOTInductor model
// (torch/csrc/inductor/aoti_runtime/interface.h, the functions torch's AOTIModelContainerRunner
// looks up), for one Linear layer, y = x @ weight^T + bias, on any device torch drives.
// AOTInductor cannot compile for the simulated device, so this is how instanttensor's
// load_constants on a runner is tested on a device target (tests/python/test_aoti_device.py).
//
// Its constant buffers behave as AOTInductor's container does (model_container.h), where the
// loader depends on it: two buffers (active, inactive), each raw device memory allocated on first
// update; an update refuses a tensor on another device type before changing anything, copies
// storage-size bytes from each given tensor into the buffer and makes the buffer's tensor, not
// owning its memory, with the model's shape and the given tensor's strides; freeing the inactive
// buffer frees its memory and leaves its tensors pointing there (so a write into a freed buffer
// shows as a stale access on the simulated device); run() refuses a buffer never updated or
// freed; the swap waits for runs underway. Unlike AOTInductor's, run() computes on the host (the
// simulated device has no kernels), and there is no constant folding.
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/inductor/aoti_runtime/interface.h>

#include <array>
#include <map>
#include <shared_mutex>
#include <string>
#include <unordered_map>

namespace {

constexpr int64_t kIn = 3, kOut = 4;

struct Constant {
  const char* name;
  const char* fqn;
  std::vector<int64_t> shape;
};
const std::array<Constant, 2> kConstants = {
    {{"linear_weight", "linear.weight", {kOut, kIn}}, {"linear_bias", "linear.bias", {kOut}}}};

struct Buffer {
  c10::DataPtr blob;                      // the container's memory, raw
  std::map<std::string, at::Tensor> map;  // constant name -> its tensor over `blob`, not owning
  bool initialized = false;
};

struct Container {
  c10::Device device{c10::kCPU};
  std::array<Buffer, 2> buffers;
  int active = 0;
  std::shared_mutex run_mutex;  // runs share it; a swap takes it alone
  Buffer& target(bool use_inactive) { return buffers[use_inactive ? 1 - active : active]; }
};

thread_local std::string last_error;

Container* container_of(AOTInductorModelContainerHandle handle) {
  return reinterpret_cast<Container*>(handle);
}

at::Tensor& tensor_of(AtenTensorHandle handle) { return *reinterpret_cast<at::Tensor*>(handle); }

AtenTensorHandle handle_of(at::Tensor* tensor) {
  return reinterpret_cast<AtenTensorHandle>(tensor);
}

template <typename Body>
AOTIRuntimeError guarded(Body body) {
  try {
    body();
    return AOTI_RUNTIME_SUCCESS;
  } catch (const std::exception& error) {
    last_error = error.what();
    return AOTI_RUNTIME_FAILURE;
  }
}

AOTIRuntimeError unsupported(const char* function) {
  last_error = std::string(function) + " is not part of the test model";
  return AOTI_RUNTIME_FAILURE;
}

size_t constant_index(size_t idx) {
  if (idx >= kConstants.size()) throw std::runtime_error("constant index out of range");
  return idx;
}

int64_t slot_offset(size_t idx) { return idx == 0 ? 0 : kOut * kIn * 4; }
constexpr int64_t kBlobBytes = kOut * kIn * 4 + kOut * 4;

void update(Container& container, const std::unordered_map<std::string, AtenTensorHandle>& given,
            bool use_inactive, bool validate_full_update, bool user_managed) {
  for (const auto& constant : kConstants) {
    auto found = given.find(constant.name);
    if (found == given.end()) {
      if (validate_full_update) {
        throw std::runtime_error(std::string("Cannot find constants ") + constant.name);
      }
      continue;
    }
    if (tensor_of(found->second).device().type() != container.device.type()) {
      throw std::runtime_error(std::string("update_constant_buffer: constant '") + constant.name +
                               "' is on another device type");
    }
  }
  Buffer& buffer = container.target(use_inactive);
  for (size_t i = 0; i < kConstants.size(); ++i) {
    auto found = given.find(kConstants[i].name);
    if (found == given.end()) continue;
    const at::Tensor& source = tensor_of(found->second);
    if (user_managed) {
      buffer.map[kConstants[i].name] = source;
      continue;
    }
    if (!buffer.blob) {
      c10::DeviceGuard guard(container.device);
      buffer.blob = c10::GetAllocator(container.device.type())->allocate(kBlobBytes);
    }
    const auto& shape = kConstants[i].shape;
    std::vector<int64_t> strides(source.strides().begin(),
                                 source.strides().begin() + static_cast<int64_t>(shape.size()));
    auto* slot = static_cast<uint8_t*>(buffer.blob.get()) + slot_offset(i);
    at::Tensor tensor = at::for_blob(slot, shape)
                            .strides(strides)
                            .options(source.options())
                            .target_device(container.device)
                            .make_tensor();
    // As AOTInductor, storage-size bytes (none from a probe of 0 bytes).
    if (source.storage().nbytes() > 0) tensor.copy_(source);
    buffer.map[kConstants[i].name] = tensor;
  }
  buffer.initialized = true;
}

}  // namespace

extern "C" {

AOTI_API AOTIRuntimeError
AOTInductorModelContainerCreateWithDevice(AOTInductorModelContainerHandle* container_handle, size_t,
                                          const char* device_str, const char*) {
  return guarded([&] {
    auto* container = new Container;
    container->device = c10::Device(device_str);
    *container_handle = reinterpret_cast<AOTInductorModelContainerHandle>(container);
  });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerDelete(AOTInductorModelContainerHandle handle) {
  delete container_of(handle);
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerRun(AOTInductorModelContainerHandle handle,
                                                       AtenTensorHandle* input_handles,
                                                       size_t num_inputs,
                                                       AtenTensorHandle* output_handles,
                                                       size_t num_outputs, AOTInductorStreamHandle,
                                                       AOTIProxyExecutorHandle) {
  return guarded([&] {
    std::unique_ptr<at::Tensor> input(reinterpret_cast<at::Tensor*>(input_handles[0]));
    if (num_inputs != 1 || num_outputs != 1) throw std::runtime_error("one input, one output");
    Container& container = *container_of(handle);
    std::shared_lock<std::shared_mutex> lock(container.run_mutex);
    Buffer& active = container.target(false);
    if (!active.initialized)
      throw std::runtime_error("Unknown constant state: ConstantState::NONE");
    // The simulated device computes nothing: the product on the host, the result on the device.
    at::Tensor weight = active.map.at("linear_weight").cpu();
    at::Tensor bias = active.map.at("linear_bias").cpu();
    at::Tensor result = at::addmm(bias, input->cpu(), weight.t()).to(container.device);
    output_handles[0] = handle_of(new at::Tensor(std::move(result)));
  });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerRunSingleThreaded(
    AOTInductorModelContainerHandle handle, AtenTensorHandle* input_handles, size_t num_inputs,
    AtenTensorHandle* output_handles, size_t num_outputs, AOTInductorStreamHandle stream,
    AOTIProxyExecutorHandle executor) {
  return AOTInductorModelContainerRun(handle, input_handles, num_inputs, output_handles,
                                      num_outputs, stream, executor);
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerGetNumConstants(AOTInductorModelContainerHandle,
                                                                   size_t* num_constants) {
  *num_constants = kConstants.size();
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerGetConstantName(AOTInductorModelContainerHandle,
                                                                   size_t idx, const char** name) {
  return guarded([&] { *name = kConstants[constant_index(idx)].name; });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerGetConstantOriginalFQN(
    AOTInductorModelContainerHandle, size_t idx, const char** original_fqn) {
  return guarded([&] { *original_fqn = kConstants[constant_index(idx)].fqn; });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerGetConstantDtype(AOTInductorModelContainerHandle,
                                                                    size_t idx, int32_t* dtype) {
  return guarded([&] {
    constant_index(idx);
    *dtype = static_cast<int32_t>(c10::ScalarType::Float);
  });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerExtractConstantsMap(
    AOTInductorModelContainerHandle handle, AOTInductorConstantMapHandle map_handle,
    bool use_inactive) {
  return guarded([&] {
    auto& out = *reinterpret_cast<std::unordered_map<std::string, AtenTensorHandle>*>(map_handle);
    Buffer& buffer = container_of(handle)->target(use_inactive);
    // A freed buffer's tensors stay in its map (pointing at freed memory), as AOTInductor's.
    for (const auto& constant : kConstants) {
      auto found = buffer.map.find(constant.name);
      // The container's own handles, as AOTInductor's: the caller does not own them.
      if (found != buffer.map.end()) out.emplace(constant.fqn, handle_of(&found->second));
    }
  });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerUpdateConstantBuffer(
    AOTInductorModelContainerHandle handle, AOTInductorConstantMapHandle map_handle,
    bool use_inactive, bool validate_full_update) {
  return guarded([&] {
    update(*container_of(handle),
           *reinterpret_cast<std::unordered_map<std::string, AtenTensorHandle>*>(map_handle),
           use_inactive, validate_full_update, /*user_managed=*/false);
  });
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerUpdateUserManagedConstantBuffer(
    AOTInductorModelContainerHandle handle, AOTInductorConstantMapHandle map_handle,
    bool use_inactive, bool validate_full_update) {
  return guarded([&] {
    update(*container_of(handle),
           *reinterpret_cast<std::unordered_map<std::string, AtenTensorHandle>*>(map_handle),
           use_inactive, validate_full_update, /*user_managed=*/true);
  });
}

AOTI_API AOTIRuntimeError
AOTInductorModelContainerSwapConstantBuffer(AOTInductorModelContainerHandle handle) {
  Container& container = *container_of(handle);
  std::unique_lock<std::shared_mutex> lock(container.run_mutex);
  container.active = 1 - container.active;
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError
AOTInductorModelContainerFreeInactiveConstantBuffer(AOTInductorModelContainerHandle handle) {
  Buffer& inactive = container_of(handle)->target(true);
  inactive.blob.clear();  // the memory; the map keeps its tensors, as AOTInductor's does
  inactive.initialized = false;
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerGetNumOutputs(AOTInductorModelContainerHandle,
                                                                 size_t* num_outputs) {
  *num_outputs = 1;
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerGetCallSpec(AOTInductorModelContainerHandle,
                                                               const char** in_spec,
                                                               const char** out_spec) {
  *in_spec = "";
  *out_spec = "";
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorGetLastError(const char** error_msg) {
  *error_msg = last_error.c_str();
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerUpdateConstantBufferFromCpu(
    AOTInductorModelContainerHandle, AOTInductorConstantMapHandle, bool, bool) {
  return unsupported(__func__);
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerUpdateInactiveConstantBuffer(
    AOTInductorModelContainerHandle, AOTInductorConstantMapHandle) {
  return unsupported(__func__);
}

AOTI_API AOTIRuntimeError AOTInductorModelContainerRunConstantFolding(
    AOTInductorModelContainerHandle, bool, AOTInductorStreamHandle, AOTIProxyExecutorHandle) {
  return unsupported(__func__);
}

AOTI_API AOTIRuntimeError
AOTInductorModelContainerGetConstantsBlobSize(AOTInductorModelContainerHandle, uint64_t* size) {
  *size = static_cast<uint64_t>(kBlobBytes);
  return AOTI_RUNTIME_SUCCESS;
}

AOTI_API AOTIRuntimeError AOTInductorModelUpdateConstantsFromBlob(AOTInductorModelContainerHandle,
                                                                  const uint8_t*) {
  return unsupported(__func__);
}

}  // extern "C"
