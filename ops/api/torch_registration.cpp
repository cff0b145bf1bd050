// Every operator of the extension: torch.ops.instanttensor.* schemas and their kernels; the
// class torch.classes.instanttensor.Loader is defined by api/loader_class.cpp.
#include <torch/library.h>

#include "api/aoti_package_class.h"
#include "api/file_functions.h"
#include "api/loader_class.h"
#include "api/serialization.h"
#include "format/parsed_checkpoint.h"
#include "format/torch_dtype.h"
#include "instanttensor/instanttensor.h"
#include "io/testing_hooks.h"
#include "loader/options.h"
#include "plan/defaults.h"

namespace instanttensor {

namespace {

// torch.ops.instanttensor.load_tensors: owned, contiguous tensors in the order of `names`, each
// with its own storage. Headers are read and validated again on every call, so a file changed
// since tracing is an error, not a wrong shape.
std::vector<at::Tensor> load_tensors(std::vector<std::string> files, std::vector<std::string> names,
                                     c10::Device device) {
  OpenOptions options;
  options.device = device;
  options.keys = names;
  SafeOpen opened(std::move(files), options);
  std::vector<at::Tensor> out;
  out.reserve(names.size());
  for (const auto& name : names) out.push_back(opened.get_tensor(name));
  return out;
}

// torch.ops.instanttensor.load_file: (names in storage order, owned tensors), the Python
// load_file's one call into the engine for a host target.
std::tuple<std::vector<std::string>, std::vector<at::Tensor>> load_file_op(std::string file,
                                                                           c10::Device device) {
  return load_file_in_storage_order(file, device);
}

// torch.ops.instanttensor.load_into_: fills destinations[i] in place with the tensor names[i]
// of the files (strict: every name must exist; dtype and shape must match), in one pass.
void load_into_op(const std::vector<at::Tensor>& destinations, std::vector<std::string> files,
                  std::vector<std::string> names) {
  OpenOptions options;
  options.keys = names;
  SafeOpen opened(std::move(files), options);
  opened.load_into(names, destinations, /*strict=*/true);
}

// torch.ops.instanttensor.save_file: safetensors.torch.save_file semantics; metadata as two
// parallel lists (a schema-friendly dict), absent when has_metadata is false.
void save_tensors(std::vector<at::Tensor> tensors, std::vector<std::string> names, std::string file,
                  std::vector<std::string> metadata_keys, std::vector<std::string> metadata_values,
                  bool has_metadata) {
  if (tensors.size() != names.size() || metadata_keys.size() != metadata_values.size()) {
    throw Error(ErrorKind::Argument, file, "", "names and tensors differ in length");
  }
  std::map<std::string, at::Tensor> named;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!named.emplace(names[i], tensors[i]).second) {
      throw Error(ErrorKind::Argument, file, names[i], "tensor name given twice");
    }
  }
  std::optional<std::map<std::string, std::string>> metadata;
  if (has_metadata) {
    metadata.emplace();
    for (size_t i = 0; i < metadata_keys.size(); ++i)
      (*metadata)[metadata_keys[i]] = metadata_values[i];
  }
  save_file(named, file, metadata);
}

// The Python layer's tensor_filter: the names to match, from headers that the open following on
// this thread takes over instead of parsing them again (format/parsed_checkpoint.h).
std::vector<std::string> names_for_selection(std::vector<std::string> files) {
  auto checkpoint = std::make_unique<format::Checkpoint>(std::move(files));
  std::vector<std::string> names;
  names.reserve(checkpoint->tensors().size());
  for (const auto& tensor : checkpoint->tensors()) names.push_back(tensor.name());
  format::keep_for_next_open(std::move(checkpoint));
  return names;
}

// Flat (a0, b0, a1, b1, ...) pairs of names whose tensors share memory (save_file's check).
std::vector<std::string> shared_tensor_names(std::vector<at::Tensor> tensors,
                                             std::vector<std::string> names) {
  if (tensors.size() != names.size()) {
    throw Error(ErrorKind::Argument, "", "", "tensors and names differ in length");
  }
  std::map<std::string, at::Tensor> named;
  for (size_t i = 0; i < names.size(); ++i) named.emplace(names[i], tensors[i]);
  std::vector<std::string> flat;
  for (auto& [a, b] : tensors_sharing_memory(named)) {
    flat.push_back(a);
    flat.push_back(b);
  }
  return flat;
}

double free_memory_share_op(std::optional<double> given) {
  return loader::free_memory_share(given);
}

// "instanttensor <version> torch <version>", then " testing-hooks" in a build that carries the
// test switches (io/fault_injection.h), so a test suite can tell which build it runs on.
std::string build_info() {
  return std::string("instanttensor ") + INSTANTTENSOR_VERSION + " torch " +
         INSTANTTENSOR_TORCH_VERSION +
         (instanttensor::io::testing_hooks_built() ? " testing-hooks" : "");
}

// ([variables], [defaults as text]): plan/defaults.h's table, for the README's check.
std::tuple<std::vector<std::string>, std::vector<std::string>> defaults_op() {
  std::vector<std::string> variables, values;
  for (const auto& row : instanttensor::plan::defaults::default_table()) {
    variables.push_back(row.variable);
    values.push_back(row.value);
  }
  return {variables, values};
}

std::tuple<std::vector<std::string>, std::vector<std::string>> dtype_table_op() {
  std::vector<std::string> torch_names, format_names;
  for (auto& [torch_name, format_name] : instanttensor::format::dtype_table()) {
    torch_names.push_back(torch_name);
    format_names.push_back(format_name);
  }
  return {torch_names, format_names};
}

}  // namespace

TORCH_LIBRARY(instanttensor, m) {
  m.def("load_tensors(str[] files, str[] names, Device device) -> Tensor[]");
  // Eager (no fake kernel: how many tensors it returns is the file's to say).
  m.def("load_file(str file, Device device) -> (str[], Tensor[])", &load_file_op);
  m.def(
      "save_file(Tensor[] tensors, str[] names, str file, str[] metadata_keys, "
      "str[] metadata_values, bool has_metadata) -> ()");
  m.def("load_into_(Tensor(a!)[] destinations, str[] files, str[] names) -> ()");
  m.def("build_info() -> str", &build_info);
  // ([torch attribute names], [format names]): the element types, from the one C++ table.
  m.def("dtype_table() -> (str[], str[])", &dtype_table_op);
  // ([environment variables], [their defaults as the README states them]).
  m.def("defaults() -> (str[], str[])", &defaults_op);
  // Header-only: the Python layer matches tensor_filter patterns against these names; the open
  // that follows on the same thread reuses the headers (any open there drops them).
  m.def("tensor_names(str[] files) -> str[]", &names_for_selection);
  // The share of free accelerator memory the loader may use (max_free_mem_usage, the
  // environment, the default): the one parse of it, for the Python layer's budget.
  m.def("free_memory_share(float? given) -> float", &free_memory_share_op);
  m.def("shared_tensor_names(Tensor[] tensors, str[] names) -> str[]", &shared_tensor_names);
  // safetensors' serialize/deserialize: the header text and the data order for bytes the Python
  // layer joins; the header of an in-memory file, parsed to the reader's rules.
  m.def(
      "serialize_header(str[] names, str[] dtypes, int[] ranks, int[] dims, int[] nbytes, "
      "str[] metadata_keys, str[] metadata_values, bool has_metadata, str label) -> (str, int[])",
      &serialize_header_op);
  m.def(
      "serialize_file(Tensor[] data, str[] names, str[] dtypes, int[] ranks, int[] dims, "
      "str file, str[] metadata_keys, str[] metadata_values, bool has_metadata) -> ()",
      &serialize_file_op);
  m.def(
      "parse_header_bytes(Tensor head, int total_size, str label) -> (str[], str[], int[], int[], "
      "int[], int[], bool, str[], str[], int)",
      &parse_header_bytes_op);
  define_loader_class(m);
  define_aoti_package_class(m);
}

TORCH_LIBRARY_IMPL(instanttensor, CompositeExplicitAutograd, m) {
  m.impl("load_tensors", &load_tensors);
  m.impl("save_file", &save_tensors);
  m.impl("load_into_", &load_into_op);
}

}  // namespace instanttensor
