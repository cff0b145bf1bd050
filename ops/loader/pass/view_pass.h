// The pass over views of the page cache (PageCacheViews): nothing is read into loader memory;
// each tensor is a view of its file's private mapping during its step; one the consumer still
// holds when the pass moves on is kept under a lease on its file, or made owned where the kernel
// refuses the lease. copy=true and copy=false on a host target.
#pragma once

#include <memory>

#include "loader/access/tensor_factory.h"
#include "loader/pass/page_cache_views.h"
#include "loader/pass/pass.h"

namespace instanttensor::loader {

class ViewPass : public Pass {
 public:
  // Over `mapping` (map_for_views), its next `window` bytes brought in as `read_ahead` says
  // (workers, or advice on the consumer's thread), the page cache used as `cache_use` says
  // (PageCacheViews). `plan`, `factory` and `stats` outlive the pass.
  ViewPass(const PassPlan& plan, std::shared_ptr<const io::MappedFiles> mapping,
           TensorFactory& factory, Stats& stats, uint64_t window, io::ReadAheadPolicy read_ahead,
           CacheUse cache_use);

  std::optional<Error> settle(size_t item) override { return views_->settle(item); }
  // The view of `item`. A file changed since open fails the pass (Error(Io) naming it).
  std::pair<std::string, at::Tensor> hand_out(size_t item) override;
  void end() override { views_->pass_ended(); }
  void leave_parent_work_behind() override;
  // Views still held are leased or made owned and the read-ahead joined, before the files close.
  uint64_t release_memory() override;
  std::string description() const override { return views_->description(); }

 protected:
  void on_begin() override { views_->begin_pass(); }

 private:
  TensorFactory& factory_;
  Stats& stats_;
  std::unique_ptr<PageCacheViews> views_;
};

}  // namespace instanttensor::loader
