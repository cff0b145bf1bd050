// Every schema of the extension, in one place: torch.ops.instanttensor.* and
// torch.classes.instanttensor.Loader. Nothing else lives here.
#include <torch/custom_class.h>
#include <torch/library.h>

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

// torch.classes.instanttensor.Loader: SafeOpen for Python and TorchScript. Methods run without
// the GIL; SafeOpen serializes concurrent calls.
class LoaderHolder : public torch::CustomClassHolder {
 public:
  LoaderHolder(std::vector<std::string> files, c10::Device device, bool copy,
               std::optional<std::vector<std::string>> keys, std::optional<int64_t> buffer_size,
               std::optional<int64_t> chunk_size, std::optional<int64_t> concurrency,
               std::optional<int64_t> io_depth, std::optional<std::string> backend,
               std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> process_group,
               std::optional<int64_t> staging_size, std::optional<int64_t> device_budget,
               bool host_fallback, bool force_staging, std::optional<std::string> exchange,
               std::optional<double> max_free_mem_usage)
      : opened_(std::move(files), [&] {
          OpenOptions options;
          options.device = device;
          options.copy = copy;
          options.keys = std::move(keys);
          options.buffer_size = buffer_size;
          options.chunk_size = chunk_size;
          options.concurrency = concurrency;
          options.io_depth = io_depth;
          options.backend = std::move(backend);
          if (process_group) options.process_group = *process_group;
          options.staging_size = staging_size;
          options.device_budget = device_budget;
          options.host_fallback = host_fallback;
          options.force_staging = force_staging;
          options.exchange = std::move(exchange);
          options.max_free_mem_usage = max_free_mem_usage;
          // The Python layer raises open_warnings() as Python warnings; c10's handler (stderr)
          // would say it a second time.
          options.print_warnings = false;
          return options;
        }()) {}

  // What opening warned about, for the Python layer to raise as Python warnings.
  std::vector<std::string> open_warnings() { return opened_.warnings(); }

  std::vector<std::string> keys() { return opened_.keys(); }
  std::vector<std::string> offset_keys() { return opened_.offset_keys(); }
  bool has_metadata() { return opened_.metadata().has_value(); }
  c10::Dict<std::string, std::string> metadata() {
    c10::Dict<std::string, std::string> out;
    if (auto meta = opened_.metadata()) {
      for (const auto& [key, value] : *meta) out.insert(key, value);
    }
    return out;
  }
  // (torch dtype name without the "torch." prefix, torch shape)
  std::tuple<std::string, std::vector<int64_t>> get_tensor_metadata(const std::string& name) {
    auto meta = opened_.get_tensor_metadata(name);
    return {instanttensor::format::torch_dtype_name(meta.dtype), meta.shape};
  }
  at::Tensor get_tensor(const std::string& name) { return opened_.get_tensor(name); }
  // (missing keys, unexpected keys); both empty when strict (mismatches raise instead).
  std::tuple<std::vector<std::string>, std::vector<std::string>> load_into(
      std::vector<std::string> names, std::vector<at::Tensor> destinations, bool strict) {
    auto result = opened_.load_into(names, destinations, strict);
    return {std::move(result.missing_keys), std::move(result.unexpected_keys)};
  }
  at::Tensor get_rows(const std::string& name, int64_t start, int64_t stop) {
    return opened_.get_rows(name, start, stop);
  }
  void restart() { opened_.restart(); }
  std::optional<std::tuple<std::string, at::Tensor>> next() {
    auto item = opened_.next();
    if (!item) return std::nullopt;
    return std::make_tuple(std::move(item->first), std::move(item->second));
  }
  c10::Dict<std::string, double> stats() {
    Stats s = opened_.stats();
    c10::Dict<std::string, double> out;
    out.insert("bytes_read", static_cast<double>(s.bytes_read));
    out.insert("bytes_received", static_cast<double>(s.bytes_received));
    out.insert("read_requests", static_cast<double>(s.read_requests));
    out.insert("tensors_loaded", static_cast<double>(s.tensors_loaded));
    out.insert("materializations", static_cast<double>(s.materializations));
    out.insert("misaligned_copies", static_cast<double>(s.misaligned_copies));
    out.insert("leased_views", static_cast<double>(s.leased_views));
    out.insert("buffer_size", static_cast<double>(s.buffer_size));
    out.insert("peak_pool_bytes", static_cast<double>(s.peak_pool_bytes));
    out.insert("recycled_blocks", static_cast<double>(s.recycled_blocks));
    out.insert("open_seconds", s.open_seconds);
    out.insert("read_seconds", s.read_seconds);
    out.insert("wait_seconds", s.wait_seconds);
    out.insert("copy_seconds", s.copy_seconds);
    out.insert("exchange_seconds", s.exchange_seconds);
    return out;
  }
  std::string backend() { return opened_.stats().backend; }
  std::string exchange() { return opened_.stats().exchange; }
  int64_t total_tensor_size() { return static_cast<int64_t>(opened_.total_tensor_size()); }
  int64_t buffer_size() { return static_cast<int64_t>(opened_.buffer_size()); }
  bool copy() { return opened_.copy(); }
  void close() { opened_.close(); }

 private:
  SafeOpen opened_;
};

}  // namespace

TORCH_LIBRARY(instanttensor, m) {
  m.def("load_tensors(str[] files, str[] names, Device device) -> Tensor[]");
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
  m.class_<LoaderHolder>("Loader")
      .def(torch::init<std::vector<std::string>, c10::Device, bool,
                       std::optional<std::vector<std::string>>, std::optional<int64_t>,
                       std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>,
                       std::optional<std::string>,
                       std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>,
                       std::optional<int64_t>, std::optional<int64_t>, bool, bool,
                       std::optional<std::string>, std::optional<double>>(),
           "Opens safetensors files; only `files` is required.",
           {torch::arg("files"), torch::arg("device") = c10::IValue(c10::Device(c10::kCPU)),
            torch::arg("copy") = true, torch::arg("keys") = torch::arg::none(),
            torch::arg("buffer_size") = torch::arg::none(),
            torch::arg("chunk_size") = torch::arg::none(),
            torch::arg("concurrency") = torch::arg::none(),
            torch::arg("io_depth") = torch::arg::none(), torch::arg("backend") = torch::arg::none(),
            torch::arg("process_group") = torch::arg::none(),
            torch::arg("staging_size") = torch::arg::none(),
            torch::arg("device_budget") = torch::arg::none(), torch::arg("host_fallback") = false,
            torch::arg("force_staging") = false, torch::arg("exchange") = torch::arg::none(),
            torch::arg("max_free_mem_usage") = torch::arg::none()})
      .def("keys", &LoaderHolder::keys)
      .def("offset_keys", &LoaderHolder::offset_keys)
      .def("has_metadata", &LoaderHolder::has_metadata)
      .def("metadata", &LoaderHolder::metadata)
      .def("get_tensor_metadata", &LoaderHolder::get_tensor_metadata)
      .def("get_tensor", &LoaderHolder::get_tensor)
      .def("get_rows", &LoaderHolder::get_rows)
      .def("load_into", &LoaderHolder::load_into)
      .def("restart", &LoaderHolder::restart)
      .def("next", &LoaderHolder::next)
      .def("stats", &LoaderHolder::stats)
      .def("backend", &LoaderHolder::backend)
      .def("exchange", &LoaderHolder::exchange)
      .def("total_tensor_size", &LoaderHolder::total_tensor_size)
      .def("buffer_size", &LoaderHolder::buffer_size)
      .def("copy", &LoaderHolder::copy)
      .def("open_warnings", &LoaderHolder::open_warnings)
      .def("close", &LoaderHolder::close);
}

TORCH_LIBRARY_IMPL(instanttensor, CompositeExplicitAutograd, m) {
  m.impl("load_tensors", &load_tensors);
  m.impl("save_file", &save_tensors);
  m.impl("load_into_", &load_into_op);
}

}  // namespace instanttensor
