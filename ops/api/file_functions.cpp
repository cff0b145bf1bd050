// load_file and save_file, compatible with safetensors.torch.
#include "api/file_functions.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "format/checkpoint.h"
#include "format/torch_dtype.h"
#include "format/writer.h"
#include "instanttensor/instanttensor.h"
#include "loader/options.h"
#include "plan/host_policy.h"

namespace instanttensor {

std::vector<std::string> tensor_names(std::vector<std::string> files) {
  format::Checkpoint checkpoint(std::move(files));
  std::vector<std::string> names;
  names.reserve(checkpoint.tensors().size());
  for (const auto& tensor : checkpoint.tensors()) names.push_back(tensor.name());
  return names;
}

std::tuple<std::vector<std::string>, std::vector<at::Tensor>> load_file_in_storage_order(
    const std::string& file, c10::Device device) {
  OpenOptions options;
  options.device = device;
  SafeOpen opened(file, options);
  std::vector<std::string> names = opened.offset_keys();
  std::vector<at::Tensor> tensors;
  tensors.reserve(names.size());
  plan::LoadFileInputs in;
  in.selected_bytes = opened.total_tensor_size();
  in.tensors = names.size();
  in.host_target = device.is_cpu();
  // The mmap backend first in the chain (given or from INSTANTTENSOR_BACKEND): random access
  // would hand out views of the mapping. Where it then failed and another backend reads, the
  // pass is taken all the same: slower for a small file, never a view that is not owned.
  in.random_access_maps = loader::resolve_options(options).backends.front() == "mmap";
  if (plan::choose_load_file_path(in) == plan::LoadFilePath::EachTensorRead) {
    for (const auto& name : names) tensors.push_back(opened.get_tensor(name));
  } else {
    names.clear();  // the names as the pass hands them out, never assumed in step
    for (auto& [name, tensor] : opened) {
      names.push_back(name);
      tensors.push_back(tensor);
    }
  }
  return {std::move(names), std::move(tensors)};
}

std::map<std::string, at::Tensor> load_file(const std::string& file, c10::Device device) {
  auto [names, tensors] = load_file_in_storage_order(file, device);
  std::map<std::string, at::Tensor> by_name;
  for (size_t i = 0; i < names.size(); ++i) by_name.emplace(names[i], std::move(tensors[i]));
  return by_name;
}

std::vector<std::pair<std::string, std::string>> tensors_sharing_memory(
    const std::map<std::string, at::Tensor>& tensors) {
  // (device, storage, byte range) of every tensor with bytes.
  std::vector<std::tuple<std::string, const void*, uint64_t, uint64_t, std::string>> spans;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined() || tensor.is_meta() || tensor.numel() == 0) continue;
    uint64_t begin = tensor.storage_offset() * tensor.element_size();
    spans.emplace_back(tensor.device().str(), tensor.storage().data(), begin,
                       begin + tensor.nbytes(), name);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<std::string, std::string>> shared;
  for (size_t i = 1; i < spans.size(); ++i) {
    const auto& a = spans[i - 1];
    const auto& b = spans[i];
    if (std::get<0>(a) == std::get<0>(b) && std::get<1>(a) == std::get<1>(b) &&
        std::get<2>(b) < std::get<3>(a)) {
      shared.emplace_back(std::get<4>(a), std::get<4>(b));
    }
  }
  return shared;
}

void save_file(const std::map<std::string, at::Tensor>& tensors, const std::string& file,
               const std::optional<std::map<std::string, std::string>>& metadata) {
  std::vector<at::Tensor> host;  // keeps host copies alive while writing
  std::vector<format::WriterTensor> entries;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) throw Error(ErrorKind::Argument, file, name, "undefined tensor");
    // A meta tensor has no bytes: refused before anything is written (the old file stays).
    if (tensor.is_meta()) {
      throw Error(ErrorKind::Argument, file, name,
                  "Cannot copy out of meta tensor; it has no data to save");
    }
    if (!tensor.is_contiguous()) {
      throw Error(ErrorKind::Argument, file, name,
                  "tensor is not contiguous; call .contiguous() before saving");
    }
    at::Tensor on_host = tensor.device().is_cpu() ? tensor : tensor.cpu();
    host.push_back(on_host);
    format::WriterTensor entry;
    entry.name = name;
    entry.dtype = format::from_torch_dtype(tensor.scalar_type(), file, name);
    for (int64_t dim : tensor.sizes()) entry.shape.push_back(static_cast<uint64_t>(dim));
    if (entry.dtype == format::Dtype::F4) {
      if (entry.shape.empty()) {
        throw Error(ErrorKind::Argument, file, name, "0-d float4_e2m1fn_x2 cannot be stored");
      }
      entry.shape.back() *= 2;  // two F4 values per byte
    }
    entry.data = on_host.numel() > 0 ? on_host.data_ptr() : nullptr;
    entry.nbytes = on_host.nbytes();
    entries.push_back(std::move(entry));
  }
  auto shared = tensors_sharing_memory(tensors);
  if (!shared.empty()) {
    throw Error(
        ErrorKind::Argument, file, shared[0].second,
        "shares memory with tensor '" + shared[0].first + "'; clone one of them before saving");
  }
  format::write_safetensors(file, entries, metadata ? &*metadata : nullptr);
}

}  // namespace instanttensor
