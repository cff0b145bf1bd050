// Ranks that exchange bytes: each reads its share of every unit of a group (ReadPass, through
// its share feed), then one status round and one in-place gather per unit give every rank the
// whole group. Every rank walks the same items and makes the same collectives in the same
// order, whatever fails where: a failure travels with the next round and raises on every rank
// together.
#pragma once

#include <vector>

#include "loader/pass/read_pass.h"
#include "loader/walk/ranks_walk.h"

namespace instanttensor::loader {

class ExchangingWalk : public RanksWalk {
 public:
  // `exchange` is prepared for gathers at the mode's place. `pass` and `stats` outlive the walk.
  ExchangingWalk(ReadPass& pass, std::unique_ptr<ExchangeProtocol> exchange, Stats& stats)
      : RanksWalk(pass, std::move(exchange), stats), reads_(pass) {}

  std::optional<std::pair<std::string, at::Tensor>> next() override;

 private:
  // The gathers of the last pass are waited for and its deferred failure forgotten first.
  void begin();
  // Group `g` through its status rounds (carrying `failure`, or a deferred one) and gathers.
  void exchange_group(size_t g, std::optional<Error> failure);
  // The Error of a failed read of the first `units` units of `g` (SIZE_MAX: all), once landed.
  std::optional<Error> landing_failure(size_t g, size_t units);

  ReadPass& reads_;
  std::vector<size_t> units_exchanged_;  // per group: units through their round and gather
};

}  // namespace instanttensor::loader
