// Host identities (loader/exchange/host_identity.h): equal for one kernel and the same files,
// different for copies of the files, overridable in tests; and the topology each rank derives.
#include <fcntl.h>
#include <gtest/gtest.h>
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

TEST(HostIdentity, TheSameFilesOnOneKernelAgreeAndCopiesDiffer) {
  std::string a = write_file("a");
  std::string copy = write_file("copy");
  int fd_a = ::open(a.c_str(), O_RDONLY);
  int fd_a_again = ::open(a.c_str(), O_RDONLY);  // another open of the same inode
  int fd_copy = ::open(copy.c_str(), O_RDONLY);
  ASSERT_GE(fd_a, 0);
  ASSERT_GE(fd_copy, 0);
  EXPECT_EQ(host_identity({fd_a}), host_identity({fd_a_again}));
  EXPECT_NE(host_identity({fd_a}), host_identity({fd_copy}));
  EXPECT_NE(host_identity({fd_a}), host_identity({fd_a, fd_copy}));
  ::close(fd_a);
  ::close(fd_a_again);
  ::close(fd_copy);
}

TEST(HostIdentity, TheTestingOverrideNamesAHost) {
  std::string a = write_file("override");
  int fd = ::open(a.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const uint64_t real = host_identity({fd});
  ::setenv("INSTANTTENSOR_TESTING_HOST_ID", "host-a", 1);
  const uint64_t host_a = host_identity({fd});
  ::setenv("INSTANTTENSOR_TESTING_HOST_ID", "host-b", 1);
  const uint64_t host_b = host_identity({fd});
  ::unsetenv("INSTANTTENSOR_TESTING_HOST_ID");
  EXPECT_NE(host_a, host_b);
  EXPECT_NE(host_a, real);
  EXPECT_EQ(host_identity({fd}), real);
  ::close(fd);
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

}  // namespace
}  // namespace instanttensor::loader
