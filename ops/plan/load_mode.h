// The load mode: how one loader moves bytes, chosen once at open by a pure function, so every
// part of the loader asks one value instead of testing flags. Torch-free (tested in the core
// test binary, as a table).
#pragma once

#include <cstdint>
#include <string>

namespace instanttensor::plan {

// Where the bytes of a distributed load meet.
enum class ExchangePlace {
  Local,   // no exchange: one process, a group with no backend for the target, a host target
           // (auto) or exchange=never: every rank reads the whole checkpoint itself
  Host,    // host memory (a CPU target): reads land in the host ring, gathered there
  Device,  // the target's memory behind the transfer stage: the device ring, gathered there
};

// Whether a process group exchanges bytes: `auto` decides by cost (below), `always` and
// `never` override it (OpenOptions::exchange, INSTANTTENSOR_EXCHANGE).
enum class ExchangePolicy { Auto, Always, Never };

// Why the mode exchanges or not, for stats() and the debug line (describe_exchange).
enum class ExchangeReason {
  SingleProcess,  // no group, or a group of one rank
  NoBackend,      // the group has no backend for the target's device type
  OneHost,        // host target, every rank on one host: the page cache is already shared
  SeveralHosts,   // host target, ranks on several hosts: each rank reads everything (measured
                  // faster than gloo's exchange; see load_mode.cpp)
  DeviceTarget,   // device target: each rank copies 1/world over its bus, the backend the rest
  Forced,         // policy always
  Refused,        // policy never
};

// Where a read group's bytes live until they are handed out.
enum class Destination {
  HostOwned,    // one tensor, read into its own host storage (CPU copy=true; host fallback)
  HostRing,     // the host borrow ring (CPU borrow; the host exchange)
  DeviceOwned,  // one tensor, streamed into its own device storage (accelerator copy=true)
  DeviceRing,   // the device ring (accelerator borrow; the device exchange)
};

struct LoadModeInputs {
  bool accelerator_target = false;  // the target device is not the CPU
  bool force_staging = false;       // tests: a CPU target through the transfer stage
  bool host_fallback = false;       // asked: tensors over the device budget stay on the host
  bool copy = true;                 // the consumer owns what it gets
  bool mapping_backend = false;     // the read backend is the file mapping (mmap)
  // The backend chain lets iteration hand out views of the page cache (it starts with auto or
  // mmap): a host target then reads nothing into loader memory (PageCacheViews).
  bool page_cache_views = false;
  bool distributed = false;          // a process group of more than one rank
  bool group_serves_target = false;  // the group has a backend for the target's device type
  ExchangePolicy exchange_policy = ExchangePolicy::Auto;
  // Distinct page-cache domains among the ranks (the handshake's host identities); 1 until
  // the handshake has run.
  int hosts = 1;
};

// How a pass gets its bytes (loader/pass/): reads into loader memory, views of the page cache,
// or views of the file mapping for their whole life (mmap + borrow).
enum class PassKind { Read, PageCacheViews, Mapped };
// How the ranks walk a pass (loader/walk/): alone, in step with status rounds, or exchanging
// bytes in step.
enum class WalkKind { Alone, InStep, Exchanging };

struct LoadMode {
  bool accelerator = false;       // the target is an accelerator (not the CPU)
  bool staged = false;            // reads go through the staging ring to the target's memory
  bool ring = false;              // groups land in a borrow ring (else each tensor in its own)
  bool host_fallback = false;     // staged: a tensor over the device budget is read on the host
  bool mapped_access = false;     // random access hands out views of the file mapping
  bool mapped_iteration = false;  // iteration too: no ring, no reads
  // Iteration hands out views of the page cache, made owned when kept past their step
  // (copy=true and copy=false alike): no reads into loader memory.
  bool host_views = false;
  ExchangePlace exchange = ExchangePlace::Local;
  // A process group that cannot exchange the target's bytes: every rank reads alone (the
  // loader warns).
  bool exchange_fell_back = false;
  // The ranks walk the pass in step over the group, exchanging or not: a handshake at open and
  // status rounds, so a failure on one rank raises on every rank.
  bool in_step = false;
  ExchangeReason reason = ExchangeReason::SingleProcess;

  bool exchanging() const { return exchange != ExchangePlace::Local; }
  // The pass and the walk the open composes: one value each, from the flags above.
  PassKind pass_kind() const {
    return mapped_iteration ? PassKind::Mapped
           : host_views     ? PassKind::PageCacheViews
                            : PassKind::Read;
  }
  WalkKind walk_kind() const {
    return !in_step ? WalkKind::Alone : exchanging() ? WalkKind::Exchanging : WalkKind::InStep;
  }
  // Whether a group is read as rank shares in units (the staged path and the exchanges) rather
  // than as one read into its destination.
  bool uses_shares(Destination where) const;
  // The destination of a group whose first (for owned groups: only) tensor has `first_bytes`,
  // given the device memory budget agreed at open.
  Destination destination_of(uint64_t first_bytes, uint64_t device_budget) const;
  // Random access and host-fallback tensors: whether a tensor of `nbytes` is copied to the
  // target device after its host read.
  bool moves_to_target(uint64_t nbytes, uint64_t device_budget) const;
};

// Any thread; pure.
LoadMode choose_load_mode(const LoadModeInputs& in);

// "none (one host, host target)", "device (device target)", ...: what stats() reports. Pure.
std::string describe_exchange(const LoadMode& mode);

}  // namespace instanttensor::plan
