#include "loader/reads/read_scheduler.h"

namespace instanttensor::loader {

Error read_failure_error(const ReadFailure& failure, const std::string& file,
                         const std::string& name) {
  if (failure.error != 0) {
    return Error(error_kind_for_errno(failure.error), file, name,
                 std::string("read failed: ") + errno_message(failure.error));
  }
  return Error(ErrorKind::Io, file, name, "file shrank during the load (short read)");
}

ReadScheduler::ReadScheduler(io::IoSetup& io, int threads, int depth, uint64_t chunk_size,
                             Stats& stats, uint32_t idle_spin_us)
    : io_(io),
      threads_(threads),
      depth_(depth),
      idle_spin_us_(idle_spin_us),
      chunk_size_(chunk_size),
      stats_(stats) {}

ReadScheduler::~ReadScheduler() { drain(); }

io::ReadBackend& ReadScheduler::backend() {
  if (!backend_) {
    backend_ = io_.start_backend(threads_, depth_, idle_spin_us_);
    stats_.backend = io_.description();
  }
  return *backend_;
}

size_t ReadScheduler::submit(size_t file_index, const plan::AlignedRange& range, uint8_t* dest,
                             uint64_t tag, bool buffered) {
  auto pieces = plan::split_into_pieces(range, chunk_size_);
  if (pieces.empty()) return 0;
  const bool through_buffered = buffered || !io_.reads_direct(file_index);
  const bool held_elsewhere = through_buffered && io_.buffered_in_use(file_index);
  int fd = through_buffered ? io_.buffered_fd(file_index) : io_.read_fd(file_index);
  if (files_.size() <= file_index) files_.resize(file_index + 1);
  FileReads& reads = files_[file_index];
  reads.held = true;
  if (through_buffered && !held_elsewhere) reads.release_buffered = true;
  tags_[tag].pending += pieces.size();
  size_t queued = 0;
  try {
    for (const auto& piece : pieces) {
      backend().submit(io::ReadRequest{fd, range.begin + piece.offset, piece.length,
                                       dest + piece.offset, tag, piece.required, file_index});
      queued += 1;
      reads.pieces += 1;  // counted once queued
      timeline_.instant(PassTimeline::Kind::ReadSubmitted, piece.length, tag);
    }
  } catch (...) {
    // The tag waits only for the pieces that were queued: counting the others would leave a
    // wait for completions that never come.
    tags_[tag].pending -= pieces.size() - queued;
    if (reads.pieces == 0) release_file(file_index);  // a backend that could not start
    throw;
  }
  return pieces.size();
}

void ReadScheduler::piece_done(size_t file) {
  if (file < files_.size() && files_[file].pieces > 0) files_[file].pieces -= 1;
}

void ReadScheduler::release_if_idle(size_t file) noexcept {
  if (file < files_.size() && files_[file].held && files_[file].pieces == 0) release_file(file);
}

void ReadScheduler::release_idle_files() noexcept {
  for (size_t file = 0; file < files_.size(); ++file) release_if_idle(file);
}

void ReadScheduler::release_file(size_t file) noexcept {
  try {
    io_.release(file, files_[file].release_buffered);
  } catch (...) {
    // A lock that could not be taken: the descriptor stays open until close, nothing is lost.
  }
  files_[file] = FileReads{};
}

void ReadScheduler::wait_one() {
  io::ReadCompletion completion = backend().wait_completion();
  stats_.read_seconds += completion.seconds;
  stats_.bytes_read += completion.bytes;
  stats_.read_requests += 1;
  piece_done(completion.file);
  if (timeline_.enabled()) {
    auto read_start = completion.finished - std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(completion.seconds));
    timeline_.record(PassTimeline::Kind::Read, read_start, completion.finished, completion.bytes,
                     completion.tag);
    timeline_.instant(PassTimeline::Kind::ReadBooked, completion.bytes, completion.tag);
  }
  auto found = tags_.find(completion.tag);
  if (found == tags_.end()) return;  // a forgotten tag (an abandoned pass)
  TagState& state = found->second;
  if (state.pending > 0) state.pending -= 1;
  if ((completion.error != 0 || completion.truncated) && !state.failure) {
    state.failure = ReadFailure{completion.error, completion.truncated};
    failed_.insert(completion.tag);
  }
}

bool ReadScheduler::done(uint64_t tag) const {
  auto found = tags_.find(tag);
  return found == tags_.end() || found->second.pending == 0;
}

bool ReadScheduler::succeeded(uint64_t tag) const {
  auto found = tags_.find(tag);
  return found != tags_.end() && found->second.pending == 0 && !found->second.failure;
}

std::optional<ReadFailure> ReadScheduler::failure(uint64_t tag) const {
  auto found = tags_.find(tag);
  if (found == tags_.end()) return std::nullopt;
  return found->second.failure;
}

std::optional<uint64_t> ReadScheduler::first_failed_tag() const {
  if (failed_.empty()) return std::nullopt;
  return *failed_.begin();
}

void ReadScheduler::forget(uint64_t tag) {
  tags_.erase(tag);
  failed_.erase(tag);
}

std::optional<ReadFailure> ReadScheduler::wait_for(uint64_t tag) {
  while (!done(tag)) {
    if (in_flight() == 0) {
      forget(tag);
      throw Error(ErrorKind::Internal, "", "", "a read tag waits with no read in flight");
    }
    wait_one();
  }
  auto failed = failure(tag);
  forget(tag);
  return failed;
}

void ReadScheduler::settle(uint64_t tag) noexcept {
  try {
    while (!done(tag) && in_flight() > 0) wait_one();
  } catch (const std::exception&) {
    // The backend cannot complete what it still holds: it throws only once none of its reads
    // is left in the kernel, so nothing of `tag` lands in memory after this.
  }
  forget(tag);
}

void ReadScheduler::drain() noexcept {
  while (backend_ && backend_->in_flight() > 0) {
    io::ReadCompletion completion;
    try {
      completion = backend_->wait_completion();
    } catch (const std::exception&) {
      // The backend cannot complete what it still holds (a failed io_uring submit): it throws
      // only once no read of it is left in the kernel, so nothing lands in memory after this.
      break;
    }
    stats_.bytes_read += completion.bytes;
    stats_.read_requests += 1;
    piece_done(completion.file);
  }
  // Nothing is in flight now (a backend that could not complete has nothing left in the
  // kernel): every file is released, the last one read too; a later read checks it again.
  for (size_t file = 0; file < files_.size(); ++file) {
    if (files_[file].held) release_file(file);
  }
  tags_.clear();
  failed_.clear();
}

}  // namespace instanttensor::loader
