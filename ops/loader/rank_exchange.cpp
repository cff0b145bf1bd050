#include "loader/rank_exchange.h"

#include <algorithm>
#include <cstring>

namespace instanttensor::loader {

namespace {
constexpr int64_t kMessageBytes = 1024;

at::Tensor bytes_view(uint8_t* data, uint64_t nbytes) {
  return at::from_blob(data, {static_cast<int64_t>(nbytes)}, at::TensorOptions().dtype(at::kByte));
}
}  // namespace

std::vector<int> assign_owners(const std::vector<uint64_t>& group_bytes, int world) {
  uint64_t total = 0;
  for (uint64_t bytes : group_bytes) total += bytes;
  std::vector<int> owners(group_bytes.size(), 0);
  uint64_t before = 0;
  for (size_t g = 0; g < group_bytes.size(); ++g) {
    // The rank whose share holds the middle of this group.
    uint64_t middle = before + group_bytes[g] / 2;
    owners[g] = total == 0 ? static_cast<int>(g % world)
                           : static_cast<int>(std::min<uint64_t>(
                                 world - 1, (middle * static_cast<uint64_t>(world)) / total));
    before += group_bytes[g];
  }
  return owners;
}

RankExchange::RankExchange(c10::intrusive_ptr<c10d::ProcessGroup> group)
    : group_(std::move(group)), rank_(group_->getRank()), world_(group_->getSize()) {}

void RankExchange::handshake(uint64_t digest, const std::string& file) {
  std::vector<at::Tensor> input = {at::tensor({static_cast<int64_t>(digest)}, at::kLong)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < world_; ++r) output[0].push_back(at::empty({1}, at::kLong));
  group_->allgather(output, input)->wait();
  std::string differing;
  int64_t first = output[0][0].item<int64_t>();
  for (int r = 1; r < world_; ++r) {
    if (output[0][r].item<int64_t>() != first) differing += " " + std::to_string(r);
  }
  if (!differing.empty()) {
    throw Error(ErrorKind::Argument, file, "",
                "ranks opened different checkpoints or selections (rank" + differing +
                    " differ from rank 0); every rank must open the same files with the same keys");
  }
}

void RankExchange::exchange(int owner, uint8_t* data, uint64_t nbytes,
                            const std::optional<Error>& failure) {
  // Status word (0 ok, else the error kind + 1) and the message, from every rank.
  auto header = at::zeros({8 + kMessageBytes}, at::kByte);
  if (failure) {
    int64_t status = static_cast<int64_t>(failure->kind()) + 1;
    std::memcpy(header.data_ptr(), &status, 8);
    std::string message = failure->what();
    std::memcpy(header.data_ptr<uint8_t>() + 8, message.data(),
                std::min<size_t>(message.size(), kMessageBytes - 1));
  }
  std::vector<at::Tensor> input = {header};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < world_; ++r) output[0].push_back(at::empty_like(header));
  group_->allgather(output, input)->wait();
  bool any_failed = false;
  for (int r = 0; r < world_; ++r) {
    int64_t status = 0;
    std::memcpy(&status, output[0][r].data_ptr(), 8);
    any_failed |= status != 0;
  }
  // Every rank has every status before anyone raises: one more round trip, so a failing rank
  // that exits right away cannot cut the others off mid-collective.
  if (any_failed) group_->barrier()->wait();
  if (failure) throw *failure;
  for (int r = 0; r < world_; ++r) {
    int64_t status = 0;
    std::memcpy(&status, output[0][r].data_ptr(), 8);
    if (status != 0) {
      std::string message(reinterpret_cast<const char*>(output[0][r].data_ptr<uint8_t>()) + 8);
      throw Error(static_cast<ErrorKind>(status - 1), "", "",
                  "rank " + std::to_string(r) + " failed: " + message);
    }
  }
  if (nbytes == 0) return;
  std::vector<at::Tensor> payload = {bytes_view(data, nbytes)};
  c10d::BroadcastOptions options;
  options.rootRank = owner;
  group_->broadcast(payload, options)->wait();
}

}  // namespace instanttensor::loader
