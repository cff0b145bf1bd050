// What the walks of ranks in step share (in_step_walk.h, exchanging_walk.h): the group's
// protocol, status rounds that fail the pass on every rank together, and a restart that begins
// the pass inside the next step, where a failure travels with the first round.
#pragma once

#include <memory>

#include "loader/exchange/exchange_protocol.h"
#include "loader/walk/walk.h"

namespace instanttensor::loader {

class RanksWalk : public Walk {
 public:
  // `exchange`: the protocol whose handshake ran at open. `pass` and `stats` outlive the walk.
  RanksWalk(Pass& pass, std::unique_ptr<ExchangeProtocol> exchange, Stats& stats)
      : Walk(pass), exchange_(std::move(exchange)), stats_(stats) {}

  // Distributed: the pass begins inside the next step, where a failure (a changed file) travels
  // with the first status round instead of raising on this rank alone.
  void restart() override;
  bool works_in_child() const override { return false; }
  void close() override {
    if (exchange_) exchange_->wait_gathers();
  }
  void leave_behind_after_fork() override { (void)exchange_.release(); }
  std::string rank_label() const override;

 protected:
  // One status round carrying `failure` about `file`; when any rank failed, fails the pass on
  // this rank (thrown).
  void status_round(const std::optional<Error>& failure, const std::string& file);

  std::unique_ptr<ExchangeProtocol> exchange_;
  Stats& stats_;
};

}  // namespace instanttensor::loader
