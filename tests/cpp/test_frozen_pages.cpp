// A range of a private file mapping frozen into copies and back to the file's pages.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "helper_files.h"
#include "io/frozen_pages.h"

namespace instanttensor::io {
namespace {

using testing::TempDir;

class FrozenPages : public ::testing::Test {
 protected:
  void SetUp() override {
    page_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    path_ = dir_.file("pages.bin");
    testing::write_bytes(path_, std::string(4 * page_, 'a'));
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd_, 0);
    void* mapped = ::mmap(nullptr, 4 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    mapping_ = static_cast<uint8_t*>(mapped);
  }
  void TearDown() override {
    ::munmap(mapping_, 4 * page_);
    ::close(fd_);
  }
  // The file's bytes become `c` (a writer the lease let go).
  void rewrite(char c) {
    std::string bytes(4 * page_, c);
    ASSERT_EQ(::pwrite(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }

  TempDir dir_;
  std::string path_;
  uint64_t page_ = 0;
  int fd_ = -1;
  uint8_t* mapping_ = nullptr;
};

TEST_F(FrozenPages, CopiesKeepTheOldBytesAndTheRestoredPagesShowTheFile) {
  ASSERT_TRUE(replace_by_copies(mapping_ + page_, 2 * page_, 4 * page_));
  rewrite('b');
  EXPECT_EQ(mapping_[page_], 'a');          // frozen
  EXPECT_EQ(mapping_[3 * page_ - 1], 'a');  // frozen
  EXPECT_EQ(mapping_[0], 'b');              // the file's page, shared with the page cache
  restore_file_pages(mapping_, fd_, page_, 2 * page_);
  EXPECT_EQ(mapping_[page_], 'b');
  rewrite('c');
  EXPECT_EQ(mapping_[2 * page_], 'c');  // the file's page again, not a copy of it
}

TEST_F(FrozenPages, PagesPastTheFilesEndAreZerosInTheCopies) {
  ASSERT_TRUE(replace_by_copies(mapping_, 2 * page_, page_ + 10));
  EXPECT_EQ(mapping_[page_ + 9], 'a');
  EXPECT_EQ(mapping_[page_ + 10], 0);
}

TEST_F(FrozenPages, WhereNoMappingCanBeHadTheCopiesTakeTheFilesBytes) {
  // A range that starts mid-page cannot be mapped (EINVAL): only the fallback can restore it,
  // reading the file's bytes of now into the copies, zeros past its end.
  ASSERT_TRUE(replace_by_copies(mapping_, 4 * page_, 4 * page_));
  rewrite('d');
  ASSERT_EQ(::ftruncate(fd_, static_cast<off_t>(2 * page_ + 100)), 0);
  restore_file_pages(mapping_, fd_, page_ + 1, 2 * page_);
  EXPECT_EQ(mapping_[page_], 'a');  // outside the range: the copy stays
  EXPECT_EQ(mapping_[page_ + 1], 'd');
  EXPECT_EQ(mapping_[2 * page_ + 99], 'd');
  EXPECT_EQ(mapping_[2 * page_ + 100], 0);  // past the file's end
  EXPECT_EQ(mapping_[3 * page_], 0);
  EXPECT_EQ(mapping_[3 * page_ + 1], 'a');  // past the range
}

}  // namespace
}  // namespace instanttensor::io
