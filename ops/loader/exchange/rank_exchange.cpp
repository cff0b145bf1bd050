#include "loader/exchange/rank_exchange.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace instanttensor::loader {

namespace {
constexpr int64_t kStatusBytes = 8;
constexpr int64_t kMessageBytes = 1016;  // status word + message: 1 KiB per rank per unit

// Test-only, in a library built with INSTANTTENSOR_TESTING_HOOKS:
// INSTANTTENSOR_TESTING_TRACE_COLLECTIVES=<prefix> (read at load) appends one line per
// collective this process issues to <prefix>.rank<N>, so a test can assert that every rank made
// the same calls in the same order under injected failures. Unset: nothing is written.
#ifdef INSTANTTENSOR_TESTING_HOOKS
const char* const kTracePrefix = std::getenv("INSTANTTENSOR_TESTING_TRACE_COLLECTIVES");
#else
const char* const kTracePrefix = nullptr;  // a release build traces nothing
#endif

bool tracing() { return kTracePrefix != nullptr; }

// Callers check tracing() first, so no line is built when nobody records.
void trace(int rank, const std::string& line) {
  std::ofstream(std::string(kTracePrefix) + ".rank" + std::to_string(rank), std::ios::app)
      << line << "\n";
}

}  // namespace

GatherMethod choose_gather_method(plan::ExchangePlace place, const std::string& backend_name,
                                  c10::DeviceType device) {
  if (backend_name != "gloo") return GatherMethod::AllGather;
  return place == plan::ExchangePlace::Host || device != c10::DeviceType::CPU
             ? GatherMethod::Broadcasts
             : GatherMethod::AllGather;
}

std::string describe_backends(c10d::ProcessGroup& group) {
  std::string out;
  for (const auto& device : group.getDeviceTypes()) {
    if (!out.empty()) out += ", ";
    out += c10::DeviceTypeName(device.type(), /*lower_case=*/true) + ":";
    try {
      out += group.getBackend(device.type())->getBackendName();
    } catch (const std::exception&) {
      out += "?";
    }
  }
  return out.empty() ? "none" : out;
}

RankExchange::RankExchange(c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device)
    : group_(std::move(group)),
      backend_(group_->getBackend(device.type())),
      device_(device),
      rank_(group_->getRank()),
      world_(group_->getSize()) {
  if (device_.type() != c10::DeviceType::CPU) {
    control_ = c10::impl::getDeviceGuardImpl(device_.type())
                   ->getStreamFromGlobalPool(device_, /*isHighPriority=*/true);
  }
}

void RankExchange::prepare_gathers(plan::ExchangePlace place) {
  method_ = choose_gather_method(place, backend_->getBackendName(), device_.type());
}

RankExchange::PendingGather RankExchange::start_all_gather(const at::Tensor& contribution) {
  // Small control messages (handshake, statuses): through the same backend as the data, so a
  // device-only group (NCCL) needs nothing else; read back on the host (one sync).
  // The list form of all-gather: every backend supports it, on every device type.
  c10::DeviceGuard guard(device_);
  c10::OptionalStreamGuard on_control(control_);
  PendingGather pending;
  pending.control = control_;
  pending.input = {contribution.to(device_)};
  pending.output.resize(1);
  for (int r = 0; r < world_; ++r) pending.output[0].push_back(at::empty_like(pending.input[0]));
  pending.work = backend_->allgather(pending.output, pending.input);
  return pending;
}

at::Tensor RankExchange::PendingGather::read() {
  c10::DeviceGuard guard(input[0].device());
  c10::OptionalStreamGuard on_control(control);
  work->wait();
  return at::cat(output[0]).cpu();
}

RankExchange::Agreement RankExchange::handshake(uint64_t digest, uint64_t budget,
                                                uint64_t host_identity, const std::string& file) {
  constexpr int kWords = 3;
  at::Tensor mine = at::empty({kWords}, at::kLong);
  mine[0] = static_cast<int64_t>(digest);
  mine[1] = static_cast<int64_t>(std::min<uint64_t>(budget, INT64_MAX));
  mine[2] = static_cast<int64_t>(host_identity);
  if (tracing()) trace(rank_, "handshake");
  at::Tensor all = all_gather(mine);
  const int64_t* values = all.data_ptr<int64_t>();
  std::string differing;
  Agreement agreed;
  agreed.device_budget = budget;
  for (int r = 0; r < world_; ++r) {
    if (values[kWords * r] != values[0]) {
      differing += ' ';  // not " " + ...: GCC 12's -Wrestrict misfires on it in C++20
      differing += std::to_string(r);
    }
    agreed.device_budget =
        std::min(agreed.device_budget, static_cast<uint64_t>(values[kWords * r + 1]));
    agreed.host_identities.push_back(static_cast<uint64_t>(values[kWords * r + 2]));
  }
  if (!differing.empty()) {
    throw Error(ErrorKind::Argument, file, "",
                "ranks opened different checkpoints, selections or layout options (rank" +
                    differing +
                    " differ from rank 0); every rank must open the same files with the same "
                    "selection (keys or tensor_filter), copy, buffer_size, chunk_size, "
                    "staging_size, host_fallback, staging (forced or not), exchange and target "
                    "device type");
  }
  return agreed;
}

void RankExchange::post_status(const std::optional<Error>& failure) {
  at::Tensor mine = at::zeros({kStatusBytes + kMessageBytes}, at::kByte);
  if (failure) {
    int64_t status = static_cast<int64_t>(failure->kind()) + 1;
    std::memcpy(mine.data_ptr(), &status, kStatusBytes);
    std::string message = failure->what();
    std::memcpy(mine.data_ptr<uint8_t>() + kStatusBytes, message.data(),
                std::min<size_t>(message.size(), kMessageBytes - 1));
  }
  if (tracing()) trace(rank_, "status");
  posted_.push_back({start_all_gather(mine), failure});
}

void RankExchange::settle_status(const std::string& file) {
  if (posted_.empty()) throw Error(ErrorKind::Internal, file, "", "no status round to settle");
  PostedStatus oldest = std::move(posted_.front());
  posted_.pop_front();
  at::Tensor all;
  try {
    all = oldest.round.read();
  } catch (...) {
    drain();
    throw;
  }
  const uint8_t* words = all.data_ptr<uint8_t>();
  int failed_rank = -1;
  int64_t failed_status = 0;
  for (int r = 0; r < world_ && failed_rank < 0; ++r) {
    std::memcpy(&failed_status, words + r * (kStatusBytes + kMessageBytes), kStatusBytes);
    if (failed_status != 0) failed_rank = r;
  }
  if (failed_rank < 0) return;
  // Every rank stops here, after the same status round: finish the rounds and gathers already
  // queued so no collective is left pending on the group.
  drain();
  if (oldest.failure) throw *oldest.failure;
  std::string message(reinterpret_cast<const char*>(
      words + failed_rank * (kStatusBytes + kMessageBytes) + kStatusBytes));
  throw Error(static_cast<ErrorKind>(failed_status - 1), file, "",
              "rank " + std::to_string(failed_rank) + " failed: " + message);
}

void RankExchange::abandon_rounds() noexcept {
  c10::DeviceGuard guard(device_);
  c10::OptionalStreamGuard on_control(control_);  // where their buffers were made
  for (auto& posted : posted_) {
    try {
      posted.round.work->wait();
    } catch (...) {  // a path that throws already, or a broken group the next collective meets
    }
  }
  posted_.clear();
}

void RankExchange::drain() noexcept {
  // On a path that throws already: the first error is the one to report, so a collective that
  // fails while it is waited for here is only waited for.
  abandon_rounds();
  auto works = std::move(in_flight_);
  in_flight_.clear();
  c10::DeviceGuard guard(device_);
  for (auto& work : works) {
    try {
      work->wait();
    } catch (...) {
    }
  }
}

void RankExchange::gather(at::Tensor unit) {
  int64_t slice = unit.numel() / world_;
  if (method_ == GatherMethod::AllGather) {
    if (tracing()) trace(rank_, "all_gather " + std::to_string(unit.numel()));
    at::Tensor share = unit.narrow(0, rank_ * slice, slice);
    in_flight_.push_back(backend_->_allgather_base(unit, share));
    return;
  }
  for (int root = 0; root < world_; ++root) {
    std::vector<at::Tensor> share = {unit.narrow(0, root * slice, slice)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    if (tracing()) {
      std::string line = "broadcast ";  // appended: GCC 12's -Wrestrict misfires on `" " + s`
      line += std::to_string(root);
      line += ' ';
      line += std::to_string(slice);
      trace(rank_, line);
    }
    in_flight_.push_back(backend_->broadcast(share, options));
  }
}

void RankExchange::wait_gathers() {
  // A round posted and never settled (an exception other than Error between the two) is
  // waited for, not read: the next pass starts with none.
  abandon_rounds();
  auto works = std::move(in_flight_);
  in_flight_.clear();
  for (auto& work : works) work->wait();
}

}  // namespace instanttensor::loader
