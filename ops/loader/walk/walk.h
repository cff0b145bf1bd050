// How the ranks walk a pass: one kind per way, chosen once at open from the load mode. Alone
// (alone_walk.h): one process, or ranks each reading everything with no group to meet in. In
// step (in_step_walk.h): ranks that read alone but meet in status rounds. Exchanging
// (exchanging_walk.h): ranks that read shares and gather each unit. A walk drives its Pass
// (loader/pass/pass.h) and never looks at how the pass gets its bytes. Consumer thread only
// (the loader's lock).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <utility>

#include "loader/pass/pass.h"

namespace instanttensor::loader {

class Walk {
 public:
  // `pass` outlives the walk.
  explicit Walk(Pass& pass) : pass_(pass) {}
  virtual ~Walk() = default;
  Walk(const Walk&) = delete;
  Walk& operator=(const Walk&) = delete;

  // The next tensor in storage order, beginning a pass when none was begun; nullopt once the
  // pass is over, until restart(). A failure is thrown, names the file and
  // the tensor, and stays the pass's error.
  virtual std::optional<std::pair<std::string, at::Tensor>> next() = 0;
  // A new pass from the first tensor.
  virtual void restart() { pass_.begin(); }

  // Whether a forked child can go on walking (a group's collectives cannot).
  virtual bool works_in_child() const { return true; }
  // At close: waits for what the walk queued on other streams (gathers into the pass's memory).
  virtual void close() {}
  // In a forked child at close: the group's threads were the parent's; leaked, never joined.
  virtual void leave_behind_after_fork() {}
  // " (rank 1 of 2)" for the debug line; "" alone.
  virtual std::string rank_label() const { return ""; }

 protected:
  Pass& pass_;
};

}  // namespace instanttensor::loader
