// Ranks that read alone (each the whole checkpoint, through its own pass of any kind) but walk
// in step: they meet only at StepRounds' items, so a failure on one rank (a changed file, a read
// error, no memory) makes that rank's next round at once, where every rank raises together.
#pragma once

#include "loader/exchange/step_rounds.h"
#include "loader/walk/ranks_walk.h"

namespace instanttensor::loader {

class InStepWalk : public RanksWalk {
 public:
  InStepWalk(Pass& pass, std::unique_ptr<ExchangeProtocol> exchange, StepRounds rounds,
             Stats& stats)
      : RanksWalk(pass, std::move(exchange), stats), rounds_(std::move(rounds)) {}

  std::optional<std::pair<std::string, at::Tensor>> next() override;

 private:
  StepRounds rounds_;
  size_t rounds_done_ = 0;  // status rounds made in the current pass
};

}  // namespace instanttensor::loader
