// load_constants: a constants-free AOTInductor package's weights from safetensors files.
//
// The package states its constants' names, FQNs and dtypes, but not their shapes until one of its
// buffers holds tensors. So the first load hands the package a probe per constant: a tensor of
// the checkpoint's shape whose storage holds 0 bytes. The package then allocates its own buffer,
// copies nothing, and makes its tensors (its shapes, the probe's strides) over that buffer; those
// tensors are checked against the checkpoint and filled in place by one load_into.
#include <ATen/DynamicLibrary.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/accumulate.h>

#include <optional>
#include <set>
#include <stdexcept>

#include "api/aoti_constant_match.h"
#include "format/checkpoint.h"
#include "format/message_text.h"
#include "format/torch_dtype.h"
#include "instanttensor/aoti.h"

namespace instanttensor {

namespace {

// Dimensions of a probe: the package reads as many strides as its constant has dimensions, from
// the probe's, so a constant of more dimensions than its checkpoint tensor (a shape error found
// after the probe) still reads strides the probe has.
constexpr size_t kProbeDims = 64;

// The runner's model library and container are protected members; pointers to them formed in a
// derived class (which may name them) apply to any runner. Never instantiated.
struct RunnerAccess : torch::inductor::AOTIModelContainerRunner {
  static auto library() { return &RunnerAccess::model_so_; }
  static auto container() { return &RunnerAccess::container_handle_; }
};

// A function of the runner's model library, or nullptr (no library: a runner built by hand; or
// no such symbol).
template <typename Function>
Function* library_function(torch::inductor::AOTIModelContainerRunner& runner, const char* name) {
  const auto& library = runner.*RunnerAccess::library();
  if (!library) return nullptr;
  try {
    return reinterpret_cast<Function*>(library->sym(name));
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The names of constants the package computes itself (runtime constant folding): they come from
// no checkpoint. The runner states only names, FQNs and dtypes; its model library says which.
std::set<std::string> folded_constants(torch::inductor::AOTIModelContainerRunner& runner) {
  auto* count = library_function<decltype(AOTInductorModelContainerGetNumConstants)>(
      runner, "AOTInductorModelContainerGetNumConstants");
  auto* name_of = library_function<decltype(AOTInductorModelContainerGetConstantName)>(
      runner, "AOTInductorModelContainerGetConstantName");
  auto* folded = library_function<decltype(AOTInductorModelContainerGetConstantFromFolded)>(
      runner, "AOTInductorModelContainerGetConstantFromFolded");
  std::set<std::string> names;
  if (!count || !name_of || !folded) return names;
  AOTInductorModelContainerHandle container = runner.*RunnerAccess::container();
  size_t constants = 0;
  if (count(container, &constants) != AOTI_RUNTIME_SUCCESS) return names;
  for (size_t i = 0; i < constants; ++i) {
    const char* name = nullptr;
    bool from_folded = false;
    if (name_of(container, i, &name) == AOTI_RUNTIME_SUCCESS && name &&
        folded(container, i, &from_folded) == AOTI_RUNTIME_SUCCESS && from_folded) {
      names.insert(name);
    }
  }
  return names;
}

// Bytes of weights compiled into the package's library (aot_inductor.package_constants_in_so,
// torch's default), between the symbols AOTInductor's code generator emits around them; nullopt
// for a runner without a library (built by hand) or without those symbols.
std::optional<uint64_t> compiled_in_weight_bytes(
    torch::inductor::AOTIModelContainerRunner& runner) {
  auto* start = library_function<const char>(runner, "_binary_constants_bin_start");
  auto* end = library_function<const char>(runner, "_binary_constants_bin_end");
  if (!start || !end || end < start) return std::nullopt;
  return static_cast<uint64_t>(end - start);
}

// The checkpoint in errors not tied to one of its files.
std::string files_label(const std::vector<std::string>& files) {
  return format::some_names(files, 3);
}

// The package's constants, sorted by FQN. AOTInductor's dtype codes are c10's ScalarType values
// (aoti_torch_dtype_float32() is (int32_t)ScalarType::Float).
std::vector<aoti::PackageConstant> package_constants(
    torch::inductor::AOTIModelContainerRunner& runner) {
  auto dtypes = runner.getConstantNamesToDtypes();
  auto folded = folded_constants(runner);
  std::vector<aoti::PackageConstant> constants;
  for (const auto& [name, fqn] : runner.getConstantNamesToOriginalFQNs()) {
    if (folded.count(name) != 0) continue;
    aoti::PackageConstant constant;
    constant.name = name;
    constant.fqn = fqn;
    constant.dtype = static_cast<c10::ScalarType>(dtypes.at(name));
    constants.push_back(std::move(constant));
  }
  std::sort(constants.begin(), constants.end(),
            [](const auto& a, const auto& b) { return a.fqn < b.fqn; });
  return constants;
}

// Every tensor of the files, from their validated headers (no tensor data is read).
std::map<std::string, aoti::CheckpointTensor> checkpoint_tensors(
    const std::vector<std::string>& files) {
  format::Checkpoint checkpoint(files);
  std::map<std::string, aoti::CheckpointTensor> tensors;
  for (const auto& tensor : checkpoint.tensors()) {
    const std::string& file = checkpoint.path_of(tensor);
    aoti::CheckpointTensor described;
    described.file = file;
    described.dtype = format::to_torch_dtype(tensor.entry->dtype, file, tensor.name());
    described.shape = format::to_torch_shape(*tensor.entry, file);
    tensors.emplace(tensor.name(), std::move(described));
  }
  return tensors;
}

// A tensor of `shape` (padded to kProbeDims with 1s) over a storage of 0 bytes on `device`: the
// package copies storage-size bytes from it, none, and takes its strides.
at::Tensor probe(const std::vector<int64_t>& shape, c10::ScalarType dtype, c10::Device device) {
  at::Tensor tensor = at::empty({1}, at::TensorOptions().dtype(dtype).device(device));
  tensor.storage().unsafeGetStorageImpl()->set_nbytes(0);
  std::vector<int64_t> sizes(shape);
  sizes.resize(std::max(kProbeDims, shape.size()), 1);
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t i = sizes.size() - 1; i > 0; --i) {
    strides[i - 1] = strides[i] * std::max<int64_t>(sizes[i], 1);
  }
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides);
  return tensor;
}

// After a failure once the package's buffers changed: the inactive buffer is freed; an active
// buffer is moved aside and freed, so run() refuses (its state is NONE) instead of serving
// partial weights. Never throws: the original error is what the caller needs.
void leave_refusing(torch::inductor::AOTIModelContainerRunner& runner, bool use_inactive) noexcept {
  try {
    if (!use_inactive) runner.swap_constant_buffer();
    runner.free_inactive_constant_buffer();
    if (!use_inactive) runner.swap_constant_buffer();
  } catch (...) {
  }
}

}  // namespace

ConstantsReport load_constants(torch::inductor::AOTIModelContainerRunner& runner,
                               c10::Device device, const std::vector<std::string>& files,
                               const ConstantsOptions& options) {
  if (files.empty()) throw Error(ErrorKind::Argument, "", "", "no checkpoint files given");
  const std::string label = files_label(files);
  auto constants = package_constants(runner);
  auto active = runner.extract_constants_map(/*use_inactive=*/false);
  // Loaded before: the active buffer's tensors have the package's shapes, checked below before
  // anything of the package changes.
  if (active.size() == constants.size()) {
    for (auto& constant : constants) {
      auto found = active.find(constant.fqn);
      if (found != active.end()) constant.shape = found->second.sizes().vec();
    }
  }
  auto tensors = checkpoint_tensors(files);
  auto checkpoint_name = [&](const std::string& fqn) {
    return options.rename ? options.rename(fqn) : options.prefix + fqn;
  };
  auto match = aoti::match_constants(constants, tensors, checkpoint_name, options.strict, label);
  // A package without its weights carries a placeholder of a byte; one with them carries at
  // least the constants' bytes.
  uint64_t constant_bytes = 0;
  for (const auto& pair : match.sources) {
    constant_bytes +=
        c10::multiply_integers(pair.source->shape) * c10::elementSize(pair.constant->dtype);
  }
  auto inside = compiled_in_weight_bytes(runner);
  if (inside && *inside > 1 && *inside >= constant_bytes) {
    throw Error(ErrorKind::Argument, label, "",
                "the package was compiled with its constants inside (" + std::to_string(*inside) +
                    " bytes of weights in its library, torch's default): compile it with "
                    "inductor_configs={\"aot_inductor.package_constants_in_so\": False} for its "
                    "weights to come from checkpoints");
  }

  std::unordered_map<std::string, at::Tensor> probes;
  for (const auto& pair : match.sources) {
    probes.emplace(pair.constant->name, probe(pair.source->shape, pair.constant->dtype, device));
  }
  // The package's allocations land on the current device (AOTInductor's container allocates
  // there): the package's own, where the caller named it.
  c10::DeviceGuard on_device(device);  // without an index: the current device, unchanged
  ConstantsReport report;
  try {
    if (options.use_inactive) {
      // A buffer swapped out may still be read by runs queued on the device (a caching
      // allocator's free does not wait for them): they finish first. Freeing it before the
      // probe keeps the old and the new inactive weights from coexisting.
      if (!device.is_cpu()) {
        const auto* guard_impl = c10::impl::getDeviceGuardImpl(device.type());
        guard_impl->synchronizeDevice(device.has_index() ? device.index()
                                                         : guard_impl->getDevice().index());
      }
      runner.free_inactive_constant_buffer();
    }
    try {
      runner.update_constant_buffer(probes, options.use_inactive,
                                    /*validate_full_updates=*/true, /*user_managed=*/false);
    } catch (const c10::OutOfMemoryError& refused) {
      throw Error(ErrorKind::OutOfMemory, label, "",
                  std::string("the package's buffer on ") + device.str() + ": " +
                      refused.what_without_backtrace());
    } catch (const std::exception& refused) {
      // A tensor on a device the package does not run on, or its buffer not allocated: the
      // buffer may be marked initialized already (AOTInductor does so first), so it is left
      // refusing below.
      throw Error(
          ErrorKind::Argument, label, "",
          std::string("the package took no buffer on ") + device.str() + ": " + refused.what());
    }
    auto buffers = runner.extract_constants_map(options.use_inactive);
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [fqn, buffer] : buffers) shapes.emplace(fqn, buffer.sizes().vec());
    aoti::check_shapes(match, shapes);

    std::vector<std::string> names;
    std::vector<at::Tensor> destinations;
    for (const auto& pair : match.sources) {
      names.push_back(pair.tensor);
      destinations.push_back(buffers.at(pair.constant->fqn));
      report.constants.push_back(pair.constant->fqn);
      report.bytes += destinations.back().nbytes();
    }
    OpenOptions open = options.open;
    open.keys = names;
    if (!destinations.empty()) open.device = destinations.front().device();
    SafeOpen checkpoint(files, open);
    checkpoint.load_into(names, destinations, /*strict=*/true);
    report.stats = checkpoint.stats();
  } catch (...) {
    leave_refusing(runner, options.use_inactive);
    throw;
  }
  std::sort(report.constants.begin(), report.constants.end());
  report.unused_tensors = std::move(match.unused_tensors);
  return report;
}

ConstantsReport load_constants(torch::inductor::AOTIModelPackageLoader& package,
                               const std::vector<std::string>& files,
                               const ConstantsOptions& options) {
  auto metadata = package.get_metadata();
  auto key = metadata.find("AOTI_DEVICE_KEY");
  if (key == metadata.end() || key->second.empty()) {
    throw Error(ErrorKind::Argument, files_label(files), "",
                "the package's metadata names no device (AOTI_DEVICE_KEY)");
  }
  return load_constants(*package.get_runner(), c10::Device(key->second), files, options);
}

}  // namespace instanttensor
