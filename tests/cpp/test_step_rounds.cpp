// Where ranks reading alone meet (loader/exchange/step_rounds.h): an item past each stride of
// bytes, and the end; decided by the item sizes alone.
#include <gtest/gtest.h>

#include "loader/exchange/step_rounds.h"

namespace instanttensor::loader {
namespace {

std::vector<size_t> round_items(const StepRounds& rounds) {
  std::vector<size_t> items;
  for (size_t r = 0; r < rounds.count(); ++r) items.push_back(rounds.item_of(r));
  return items;
}

TEST(StepRounds, AfterEachStrideAndAtTheEnd) {
  // Bytes before each item: 0, 40, 80, 120, 160, 200 (stride 100: past 100 at item 3, past 200
  // at item 5).
  StepRounds rounds({40, 40, 40, 40, 40, 40}, 100);
  EXPECT_EQ(round_items(rounds), (std::vector<size_t>{3, 5, 6}));
}

TEST(StepRounds, OneLargeItemCrossingSeveralStridesMakesOneRound) {
  StepRounds rounds({10, 1000, 10, 10}, 100);
  EXPECT_EQ(round_items(rounds), (std::vector<size_t>{2, 4}));
}

TEST(StepRounds, FewBytesMeetAtTheEndOnly) {
  EXPECT_EQ(round_items(StepRounds({1, 2, 3})), (std::vector<size_t>{3}));
  EXPECT_EQ(round_items(StepRounds({0, 0})), (std::vector<size_t>{2}));
}

TEST(StepRounds, NoItemsMeetOnce) {
  StepRounds rounds({});
  EXPECT_EQ(round_items(rounds), (std::vector<size_t>{0}));
}

}  // namespace
}  // namespace instanttensor::loader
