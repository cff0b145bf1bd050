// Host identities (loader/exchange/host_identity.h): equal for one kernel and the same files,
// different for copies of the files, overridable in tests; and the topology each rank derives.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "loader/exchange/host_identity.h"

namespace instanttensor::loader {
namespace {

std::string write_file(const std::string& name) {
  std::string path = ::testing::TempDir() + "/host_identity_" + name;
  std::ofstream(path) << "bytes";
  return path;
}

// The identity of the file at `path`, as a checkpoint records it when it validates the file.
FileIdentity identity_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

TEST(HostIdentity, TheSameFilesOnOneKernelAgreeAndCopiesDiffer) {
  std::string a = write_file("a");
  std::string copy = write_file("copy");
  const std::string a_again = ::testing::TempDir() + "/host_identity_a_link";
  ::unlink(a_again.c_str());
  ASSERT_EQ(::link(a.c_str(), a_again.c_str()), 0);  // another name of the same inode
  EXPECT_EQ(host_identity({identity_of(a)}), host_identity({identity_of(a_again)}));
  EXPECT_NE(host_identity({identity_of(a)}), host_identity({identity_of(copy)}));
  EXPECT_NE(host_identity({identity_of(a)}), host_identity({identity_of(a), identity_of(copy)}));
}

TEST(HostIdentity, TheTestingOverrideNamesAHost) {
  const FileIdentity file = identity_of(write_file("override"));
  const uint64_t real = host_identity({file});
  ::setenv("INSTANTTENSOR_TESTING_HOST_ID", "host-a", 1);
  const uint64_t host_a = host_identity({file});
  ::setenv("INSTANTTENSOR_TESTING_HOST_ID", "host-b", 1);
  const uint64_t host_b = host_identity({file});
  ::unsetenv("INSTANTTENSOR_TESTING_HOST_ID");
  EXPECT_NE(host_a, host_b);
  EXPECT_NE(host_a, real);
  EXPECT_EQ(host_identity({file}), real);
}

TEST(HostTopology, CountsTheRanksOfThisHostAndTheHosts) {
  const std::vector<uint64_t> one_host = {7, 7, 7};
  EXPECT_EQ(host_topology(one_host, 1).local_ranks, 3);
  EXPECT_EQ(host_topology(one_host, 1).hosts, 1);
  const std::vector<uint64_t> two_hosts = {5, 9, 5, 9, 9};
  EXPECT_EQ(host_topology(two_hosts, 0).local_ranks, 2);
  EXPECT_EQ(host_topology(two_hosts, 1).local_ranks, 3);
  EXPECT_EQ(host_topology(two_hosts, 4).hosts, 2);
  const std::vector<uint64_t> alone = {1, 2};
  EXPECT_EQ(host_topology(alone, 0).local_ranks, 1);
  EXPECT_EQ(host_topology(alone, 0).hosts, 2);
}

TEST(LauncherLocalRanks, OnlyAWholePositiveCountMakesAProcessNotAlone) {
  EXPECT_EQ(parse_local_ranks(nullptr), 1);
  EXPECT_EQ(parse_local_ranks("4"), 4);
  EXPECT_EQ(parse_local_ranks("1"), 1);
  for (const char* bad : {"", "0", "-2", "2x", " 2", "two", "99999999999999999999", "2000000"}) {
    EXPECT_EQ(parse_local_ranks(bad), 1) << bad;
  }
}

TEST(LauncherLocalRanks, TheLargestCountAnyLauncherStatesWins) {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    ::unsetenv(name);
  }
  EXPECT_EQ(launcher_local_ranks(), 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  EXPECT_EQ(launcher_local_ranks(), 2);
  ::setenv("MPI_LOCALNRANKS", "3", 1);
  EXPECT_EQ(launcher_local_ranks(), 3);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "junk", 1);
  EXPECT_EQ(launcher_local_ranks(), 3);
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    ::unsetenv(name);
  }
}

}  // namespace
}  // namespace instanttensor::loader
