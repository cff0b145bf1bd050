#include "io/page_cache_read_ahead.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "io/direct_io.h"
#include "io/thread_name.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older headers lack the name, older kernels EINVAL
#endif

namespace instanttensor::io {

namespace {

// Bytes per MADV_WILLNEED call (a multiple of any page size): on a file mapping the kernel
// reads at most a device's read-ahead size (128 KiB by default) per call of the advice.
constexpr uint64_t kAdviceSlice = 128ull << 10;

// MADV_WILLNEED over [data, data + length) (data page-aligned), in slices of kAdviceSlice;
// false when any slice is refused (past a truncated end). Advice: what is refused is left to
// the consumer's own faults. Any thread.
bool advise_will_need(uint8_t* data, uint64_t length) {
  bool advised = true;
  for (uint64_t at = 0; at < length; at += kAdviceSlice) {
    const uint64_t slice = std::min(kAdviceSlice, length - at);
    advised = ::madvise(data + at, slice, MADV_WILLNEED) == 0 && advised;
  }
  return advised;
}

}  // namespace

PageCacheReadAhead::PageCacheReadAhead(std::shared_ptr<const MappedFiles> files,
                                       const std::vector<MappedSpan>& spans, uint64_t window,
                                       uint64_t chunk, ReadAheadPolicy policy)
    : files_(std::move(files)),
      window_(window),
      thread_count_(std::max(policy.workers, 0)),
      advise_inline_(policy.advise_inline),
      method_(policy.method) {
  const uint64_t page = page_size();
  chunk = std::max(page, chunk / page * page);
  uint64_t position = 0;
  for (const auto& span : spans) {
    if (span.begin >= span.end) continue;  // no byte: no chunk (its page may be another's)
    // madvise takes page-aligned starts: widen each span down to its page, cut at page
    // multiples of the chunk so neighbouring chunks do not populate the same page twice.
    uint64_t at = span.begin / page * page;
    while (at < span.end) {
      uint64_t end = std::min(span.end, (at / chunk + 1) * chunk);
      uint64_t skipped = at < span.begin ? span.begin - at : 0;
      chunks_.push_back(Chunk{files_->data(span.file) + at, end - at, position, skipped});
      position += end - at - skipped;
      at = end;
    }
  }
  // Each worker has one slice in flight at most: its loop never allocates (no bad_alloc there).
  in_flight_.reserve(static_cast<size_t>(thread_count_));
  try {
    for (int i = 0; i < thread_count_; ++i) {
      workers_.emplace_back([this] { work(); });
      name_thread(workers_.back(), "it-read-ahead");
    }
  } catch (...) {
    // No thread to be had (a pid limit): read ahead with those started, or none; the consumer
    // faults pages in itself.
    thread_count_ = static_cast<int>(workers_.size());
  }
}

PageCacheReadAhead::~PageCacheReadAhead() {
  if (abandoned_) return;  // a parent worker may hold the mutex: never taken in the child
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    stopping_ = true;
  }
  wake_->notify_all();
  for (auto& worker : workers_) worker.join();
}

void PageCacheReadAhead::advance(uint64_t position) {
  if (abandoned_) return;
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (active_ && position <= position_) return;
    active_ = true;
    position_ = std::max(position_, position);
  }
  wake_->notify_all();
  advise_window();
}

void PageCacheReadAhead::restart() {
  if (abandoned_) return;
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    next_chunk_ = 0;
    position_ = 0;
    floor_ = 0;
    active_ = true;
  }
  settled_floor_ = 0;
  wake_->notify_all();
  advise_window();
}

void PageCacheReadAhead::abandon_after_fork() {
  abandoned_ = true;
  // The parent's threads do not exist here: their handles are leaked (joining or destroying a
  // joinable std::thread would wait forever or terminate), and the mutex one of them may have
  // held at the fork is never taken again.
  (void)new std::vector<std::thread>(std::move(workers_));
  (void)mutex_.release();
  (void)wake_.release();
  (void)populated_.release();
}

void PageCacheReadAhead::settle_before(uint64_t position) noexcept {
  if (abandoned_ || thread_count_ == 0 || position <= settled_floor_) return;
  try {
    std::unique_lock<std::mutex> lock(*mutex_);
    floor_ = std::max(floor_, position);
    populated_->wait(lock, [&] {
      return std::none_of(in_flight_.begin(), in_flight_.end(),
                          [&](uint64_t slice) { return slice < position; });
    });
    settled_floor_ = position;
  } catch (...) {
    // std::system_error from the mutex: the workers' mapping is advice, and so is this wait.
  }
}

std::string PageCacheReadAhead::description() const {
  if (thread_count_ == 0) {
    return advise_inline_ ? "MADV_WILLNEED on the consumer's thread" : "no read-ahead";
  }
  const char* how =
      method() == PopulateMethod::PopulateRead ? "MADV_POPULATE_READ" : "MADV_WILLNEED";
  return std::string(how) + ", " + std::to_string(thread_count_) + " workers";
}

void PageCacheReadAhead::wait_until_idle() {
  std::unique_lock<std::mutex> lock(*mutex_);
  // Every worker blocked, and none would find work if woken now (a wake-up not yet taken).
  populated_->wait(lock, [&] {
    return stopping_ ||
           (idle_workers_ == thread_count_ && !(active_ && next_chunk_within_window()));
  });
}

void PageCacheReadAhead::work() {
  while (true) {
    Chunk rest{};
    {
      std::unique_lock<std::mutex> lock(*mutex_);
      // Counted idle only while blocked: the predicate is checked under the lock first.
      ++idle_workers_;
      populated_->notify_all();
      wake_->wait(lock, [&] { return stopping_ || (active_ && next_chunk_within_window()); });
      --idle_workers_;
      if (stopping_) return;
      rest = chunks_[next_chunk_++];
    }
    // Slice by slice, each trimmed to the floor as it is taken: the consumer waits for one
    // slice at most when it unmaps, and a chunk it has partly passed is populated from there.
    // A chunk is counted under the mutex, with its last slice's end, or when the floor cuts off
    // the rest of one partly populated: so a chunk cut by a floor may be counted after the
    // settle_before that moved the floor returns (a statistic; no page is mapped then).
    bool populated = false;
    while (rest.length > 0) {
      Chunk slice{};
      {
        std::lock_guard<std::mutex> lock(*mutex_);
        if (stopping_) return;
        if (!clip_to_floor(rest)) {
          if (populated) chunks_populated_ += 1;
          break;
        }
        slice = rest;
        slice.length = std::min(rest.length, kPopulateSlice);
        rest.drop_front(slice.length);
        in_flight_.push_back(slice.position);
      }
      populated = populate(slice) || populated;
      {
        std::lock_guard<std::mutex> lock(*mutex_);
        in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), slice.position));
        if (rest.length == 0 && populated) chunks_populated_ += 1;
      }
      populated_->notify_all();
    }
  }
}

bool PageCacheReadAhead::clip_to_floor(Chunk& chunk) const {
  if (chunk.position >= floor_) return true;
  if (chunk.end_position() <= floor_) return false;
  // The floor's byte lies in this chunk: start at its page (data is page-aligned).
  const uint64_t page = page_size();
  const uint64_t cut = (chunk.skipped + floor_ - chunk.position) / page * page;
  if (cut > 0) chunk.drop_front(cut);  // none: the floor's byte is in the chunk's first page
  return true;
}

bool PageCacheReadAhead::next_chunk_within_window() {
  // Chunks the consumer has passed already are skipped: populating them would map pages behind
  // it again, after the views part unmapped them (a consumer faster than the storage grew
  // resident memory by the whole file). One the floor cuts is taken, and trimmed by work().
  while (next_chunk_ < chunks_.size() &&
         chunks_[next_chunk_].end_position() <= std::max(position_, floor_)) {
    ++next_chunk_;
  }
  const uint64_t ahead_limit = position_ > UINT64_MAX - window_ ? UINT64_MAX : position_ + window_;
  return next_chunk_ < chunks_.size() && chunks_[next_chunk_].position < ahead_limit;
}

void PageCacheReadAhead::advise_window() {
  if (thread_count_ > 0 || !advise_inline_) return;
  std::lock_guard<std::mutex> lock(*mutex_);  // no worker to contend with
  while (next_chunk_within_window()) {
    const Chunk& chunk = chunks_[next_chunk_++];
    if (advise_will_need(chunk.data, chunk.length)) {
      chunks_populated_ += 1;
      bytes_populated_ += chunk.length;
    }
  }
}

bool PageCacheReadAhead::populate(const Chunk& slice) {
  if (method() == PopulateMethod::PopulateRead) {
    int rc;
    do {
      rc = ::madvise(slice.data, slice.length, MADV_POPULATE_READ);
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) {
      bytes_populated_ += slice.length;
      return true;
    }
    // EINVAL: a kernel without it; keep the older advice from now on. Anything else (EFAULT
    // past a truncated end, EIO, ENOMEM): this slice is left to the consumer's own faults.
    if (errno != EINVAL) return false;
    method_ = PopulateMethod::WillNeed;
  }
  if (!advise_will_need(slice.data, slice.length)) return false;
  bytes_populated_ += slice.length;
  return true;
}

}  // namespace instanttensor::io
