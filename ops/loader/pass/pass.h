// A pass: how one loader walks its read plan in storage order and hands each tensor out. One
// kind per way of getting the bytes (read_pass.h: read into loader memory; view_pass.h: views of
// the page cache; mapped_pass.h: views of the file mapping for their whole life), chosen once at
// open from the load mode. How the ranks walk it (alone, in step, exchanging) is a Walk
// (loader/walk/walk.h) that drives a Pass through these steps. Consumer thread only (the
// loader's lock); a pass's background work never touches tensor objects.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "instanttensor/error.h"
#include "loader/pass/pass_state.h"

namespace instanttensor::pool {
class RecycledBlocks;
}

namespace instanttensor::loader {

class Pass {
 public:
  // `plan` is fixed at open and outlives the pass.
  explicit Pass(const PassPlan& plan) : plan_(plan) {}
  virtual ~Pass() = default;
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

  // The pass's own state: the walks and the loader read it; only the pass writes it (through the
  // steps below).
  const PassState& state() const { return state_; }
  const PassPlan& plan() const { return plan_; }

  // A new pass: what the last one left in flight is finished, every item is to hand out again
  // and the files are checked. A file changed since open is thrown (Error naming it) and stays
  // the pass's error.
  void begin();
  // Makes `item` (< items) ready to hand out: read and landed where it reads at all. Throws the
  // Error of a failed read, after failing the pass.
  virtual void prepare(size_t /*item*/) {}
  // The step to `item` (items.size(): the end) as ranks in step take it: prepare()'s work, any
  // failure returned instead of thrown, so that it travels with the next status round.
  virtual std::optional<Error> settle(size_t item) = 0;
  // `item`, after prepare() or settle(); the pass moves on to the next one. A dtype torch lacks
  // throws Error(Format) and skips that tensor alone.
  virtual std::pair<std::string, at::Tensor> hand_out(size_t item) = 0;
  // The last item was handed out and the consumer asked for one more.
  virtual void end() {}
  // Finishes the reads in flight of an abandoned pass before their memory is reused.
  virtual void drain() noexcept {}
  // Fails the pass with `error`: in-flight work finished, every later step says why.
  [[noreturn]] void fail(Error error);
  // Ranks in step: what the last pass left in flight is finished and the pass is not begun, so
  // that the next step begins it (where a failure travels with the first status round).
  void unbegin() noexcept;
  // In a forked child: a pass in progress at the fork cannot go on; every later step throws
  // `refusal`. A pass not begun, or already failed, is left as it is.
  void refuse_after_fork(Error refusal);
  // At close, after the reads stopped and the pass's memory was released: the per-group and
  // per-item state goes (a closed loader holds no tensor of the pass).
  void forget_items() noexcept;

  // Whether tensors are handed out from a borrow ring (a forked child cannot go on with it).
  virtual bool borrows_ring() const { return false; }
  // In a forked child: the parent's threads are gone; leaves their work behind, never joined.
  virtual void leave_parent_work_behind() {}
  // A forked child's fresh pool for the host memory of owned tensors.
  virtual void replace_pool(const std::shared_ptr<pool::RecycledBlocks>& /*recycled*/) {}
  // At close, after the reads stopped: tensors still held in the pass's memory are made owned
  // and that memory freed. Returns how many were copied out.
  virtual uint64_t release_memory() { return 0; }
  // Any other exception met while making `item` ready, as the Error a status round carries,
  // naming the item's file and tensor: ErrorKind::OutOfMemory for torch's OutOfMemoryError (a
  // device allocation), Io for anything else.
  Error failure_of(const std::exception& e, size_t item) const;
  // What stats()["backend"] says of the iteration ("" : nothing beyond the read backend).
  virtual std::string description() const { return ""; }

 protected:
  // Called by begin() after the state is reset, before the files are checked.
  virtual void on_begin() {}

  const PassPlan& plan_;
  PassState state_;
};

}  // namespace instanttensor::loader
