// Which ranks of a process group share a page cache for the checkpoint's files: the handshake
// carries each rank's identity, and ranks with equal identities read through one page cache
// (so they need not exchange what one of them reads). Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace instanttensor::loader {

// Where a file lives: its device and inode numbers (as the checkpoint validated them at open).
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
};

// A digest of the kernel's boot id (/proc/sys/kernel/random/boot_id: one per running kernel,
// shared by every container on it, new at each boot) and the device and inode numbers of each
// of `files` (the checkpoint's). The page cache belongs to a kernel and is indexed by
// inode, so two processes get equal identities exactly when they run on one kernel and opened
// the same files, not copies of them: two containers bind-mounting one folder agree; two
// machines, or two copies of the files, do not. (A hostname would make two containers on one
// machine differ though they share its cache, and says nothing about which files they see.)
// Test-only, in a library built with INSTANTTENSOR_TESTING_HOOKS:
// INSTANTTENSOR_TESTING_HOST_ID=<text> replaces the identity with a digest of the text, so a test
// on one machine can play several hosts. Any thread; reads /proc.
uint64_t host_identity(const std::vector<FileIdentity>& files);

// From every rank's identity (index: rank), what `rank` shares: how many ranks (itself
// included) have its identity, and how many distinct identities there are. Pure.
struct HostTopology {
  int local_ranks = 1;
  int hosts = 1;
};
HostTopology host_topology(const std::vector<uint64_t>& identities, int rank);

// How many processes a launcher says it started on this host, this one included, whatever group
// the process was given (a group of one or a subgroup sees only itself): torchrun's and
// accelerate's LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS
// (the largest stated). 1 where none says, or where a value is not a positive count: only a
// launcher's word makes a process not alone, and a process that is not alone keeps the page
// cache its neighbours may still read. Any thread; reads the environment.
int launcher_local_ranks();

// One such variable's value: the count, or 1 for nullptr, text that is not a whole positive
// count, or one above 1 << 20. Pure.
int parse_local_ranks(const char* value);

}  // namespace instanttensor::loader
