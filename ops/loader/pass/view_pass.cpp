#include "loader/pass/view_pass.h"

namespace instanttensor::loader {

ViewPass::ViewPass(const PassPlan& plan, std::shared_ptr<const io::MappedFiles> mapping,
                   TensorFactory& factory, Stats& stats, uint64_t window,
                   io::ReadAheadPolicy read_ahead, CacheUse cache_use)
    : Pass(plan),
      factory_(factory),
      stats_(stats),
      views_(std::make_unique<PageCacheViews>(plan, std::move(mapping), factory, stats, window,
                                              read_ahead, cache_use)) {}

std::pair<std::string, at::Tensor> ViewPass::hand_out(size_t item) {
  state_.next_item = item + 1;
  const auto& t = plan_.tensor_of_item(item);
  stats_.tensors_loaded += 1;
  if (t.nbytes == 0) return {t.name(), factory_.empty(t, c10::Device(c10::DeviceType::CPU))};
  try {
    return {t.name(), views_->hand_out(item)};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::Io) throw;  // a dtype torch lacks: that tensor alone is skipped
    fail(e);
  }
}

void ViewPass::leave_parent_work_behind() {
  views_->abandon_after_fork();
  views_->release_all();
}

uint64_t ViewPass::release_memory() {
  views_.reset();  // PageCacheViews counts what it makes owned in the stats itself
  return 0;
}

}  // namespace instanttensor::loader
