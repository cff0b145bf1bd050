#include "api/loader_class.h"

#include <torch/custom_class.h>

#include "format/torch_dtype.h"
#include "instanttensor/instanttensor.h"

namespace instanttensor {

namespace {

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
  // Every selected tensor's metadata at once, in storage order: one call instead of one per
  // name (a TorchScript method call costs about 4 us from Python; transformers asks for every
  // key's). Names, dtype names as get_tensor_metadata gives them, shapes; a tensor whose
  // metadata is an error (a dtype torch lacks) is left out, for get_tensor_metadata to raise;
  // all three empty when more than `limit` tensors are selected (asked name by name then).
  std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::vector<int64_t>>>
  all_tensor_metadata(int64_t limit) {
    std::vector<std::string> keys = opened_.offset_keys();  // not sorted: a dict is made of it
    std::vector<std::string> names, dtypes;
    std::vector<std::vector<int64_t>> shapes;
    if (static_cast<int64_t>(keys.size()) > limit) return {};
    for (auto& name : keys) {
      TensorMetadata meta{c10::ScalarType::Undefined, {}};
      try {
        meta = opened_.get_tensor_metadata(name);
      } catch (const Error&) {
        continue;
      }
      names.push_back(std::move(name));
      dtypes.push_back(instanttensor::format::torch_dtype_name(meta.dtype));
      shapes.push_back(std::move(meta.shape));
    }
    return {std::move(names), std::move(dtypes), std::move(shapes)};
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
    out.insert("advice_refused", static_cast<double>(s.advice_refused));
    out.insert("buffer_size", static_cast<double>(s.buffer_size));
    out.insert("peak_pool_bytes", static_cast<double>(s.peak_pool_bytes));
    out.insert("recycled_blocks", static_cast<double>(s.recycled_blocks));
    out.insert("staging_bytes", static_cast<double>(s.staging_bytes));
    out.insert("device_ring_bytes", static_cast<double>(s.device_ring_bytes));
    out.insert("read_bytes", static_cast<double>(s.read_bytes));
    out.insert("open_seconds", s.open_seconds);
    out.insert("read_seconds", s.read_seconds);
    out.insert("wait_seconds", s.wait_seconds);
    out.insert("copy_seconds", s.copy_seconds);
    out.insert("exchange_seconds", s.exchange_seconds);
    return out;
  }
  // (kind, start, end, bytes, tag) per event: SafeOpen::timeline.
  std::vector<std::tuple<std::string, double, double, int64_t, int64_t>> timeline() {
    std::vector<std::tuple<std::string, double, double, int64_t, int64_t>> out;
    for (auto& e : opened_.timeline()) {
      out.emplace_back(std::move(e.kind), e.start, e.end, static_cast<int64_t>(e.bytes),
                       static_cast<int64_t>(e.tag));
    }
    return out;
  }
  std::string backend() { return opened_.stats().backend; }
  std::string exchange() { return opened_.stats().exchange; }
  std::string staging() { return opened_.stats().staging; }
  int64_t total_tensor_size() { return static_cast<int64_t>(opened_.total_tensor_size()); }
  int64_t buffer_size() { return static_cast<int64_t>(opened_.buffer_size()); }
  bool copy() { return opened_.copy(); }
  void close() { opened_.close(); }

 private:
  SafeOpen opened_;
};

}  // namespace

void define_loader_class(torch::Library& m) {
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
      .def("all_tensor_metadata", &LoaderHolder::all_tensor_metadata)
      .def("get_tensor", &LoaderHolder::get_tensor)
      .def("get_rows", &LoaderHolder::get_rows)
      .def("load_into", &LoaderHolder::load_into)
      .def("restart", &LoaderHolder::restart)
      .def("next", &LoaderHolder::next)
      .def("stats", &LoaderHolder::stats)
      .def("timeline", &LoaderHolder::timeline)
      .def("backend", &LoaderHolder::backend)
      .def("exchange", &LoaderHolder::exchange)
      .def("staging", &LoaderHolder::staging)
      .def("total_tensor_size", &LoaderHolder::total_tensor_size)
      .def("buffer_size", &LoaderHolder::buffer_size)
      .def("copy", &LoaderHolder::copy)
      .def("open_warnings", &LoaderHolder::open_warnings)
      .def("close", &LoaderHolder::close);
}

}  // namespace instanttensor
