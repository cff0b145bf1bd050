// SafeOpen: the public C++ face of the Loader.
#include "instanttensor/instanttensor.h"
#include "loader/loader.h"

namespace instanttensor {

SafeOpen::SafeOpen(std::vector<std::string> files, OpenOptions options)
    : loader_(std::make_shared<Loader>(std::move(files), options)) {}

SafeOpen::SafeOpen(const std::string& file, OpenOptions options)
    : SafeOpen(std::vector<std::string>{file}, std::move(options)) {}

SafeOpen::~SafeOpen() = default;
SafeOpen::SafeOpen(SafeOpen&&) noexcept = default;
SafeOpen& SafeOpen::operator=(SafeOpen&&) noexcept = default;

std::vector<std::string> SafeOpen::keys() const { return loader_->keys(); }
std::vector<std::string> SafeOpen::offset_keys() const { return loader_->offset_keys(); }
std::optional<std::map<std::string, std::string>> SafeOpen::metadata() const {
  return loader_->metadata();
}
TensorMetadata SafeOpen::get_tensor_metadata(const std::string& name) const {
  return loader_->get_tensor_metadata(name);
}
at::Tensor SafeOpen::get_tensor(const std::string& name) { return loader_->get_tensor(name); }
LoadIntoResult SafeOpen::load_into(const std::map<std::string, at::Tensor>& destinations,
                                   bool strict) {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, tensor] : destinations) {
    names.push_back(name);
    tensors.push_back(tensor);
  }
  return loader_->load_into(names, tensors, strict);
}
LoadIntoResult SafeOpen::load_into(const std::vector<std::string>& names,
                                   const std::vector<at::Tensor>& destinations, bool strict) {
  return loader_->load_into(names, destinations, strict);
}

at::Tensor SafeOpen::get_rows(const std::string& name, int64_t start, int64_t stop) {
  return loader_->get_rows(name, start, stop);
}
void SafeOpen::restart() { loader_->restart(); }
std::optional<std::pair<std::string, at::Tensor>> SafeOpen::next() { return loader_->next(); }
Stats SafeOpen::stats() const { return loader_->stats(); }
std::vector<std::string> SafeOpen::warnings() const { return loader_->warnings(); }
std::vector<TimelineEvent> SafeOpen::timeline() const { return loader_->timeline(); }
uint64_t SafeOpen::total_tensor_size() const { return loader_->total_tensor_size(); }
uint64_t SafeOpen::buffer_size() const { return loader_->buffer_size(); }
bool SafeOpen::copy() const { return loader_->copy(); }
void SafeOpen::close() { loader_->close(); }

SafeOpen::Iterator SafeOpen::begin() {
  loader_->restart();
  Iterator it;
  it.owner_ = this;
  it.current_ = loader_->next();
  return it;
}

SafeOpen::Iterator& SafeOpen::Iterator::operator++() {
  // Drop our reference first: the item the consumer moves on from is no longer live.
  current_.reset();
  current_ = owner_->next();
  return *this;
}

}  // namespace instanttensor
