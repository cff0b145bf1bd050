// DurableFile: the name only ever refers to a complete file; nothing is left behind.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/durable_file.h"
#include "helper_files.h"
#include "instanttensor/error.h"

namespace instanttensor {
namespace {

using format::DurableFile;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::vector<std::string> entries(const std::string& folder) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(folder.c_str());
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

pid_t dead_pid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(DurableFile, AnUnnamedFileHasNoNameUntilCommitThenReplacesTheOldFile) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  write_bytes(path, "old");
  DurableFile file(path);
  ASSERT_TRUE(file.unnamed()) << "O_TMPFILE is expected on the test's file system";
  file.write("new bytes", 9);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(read_bytes(path), "old");
  file.commit();
  EXPECT_EQ(read_bytes(path), "new bytes");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(DurableFile, ANamedTemporaryIsUniqueAndRemovedWithoutCommit) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  write_bytes(path, "old");
  {
    DurableFile first(path, /*unnamed=*/false);
    DurableFile second(path, /*unnamed=*/false);
    first.write("a", 1);
    second.write("b", 1);
    EXPECT_EQ(entries(dir.path()).size(), 3u);  // two temporaries of their own
  }
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(read_bytes(path), "old");
  DurableFile named(path, /*unnamed=*/false);
  named.write("named", 5);
  named.commit();
  EXPECT_EQ(read_bytes(path), "named");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(DurableFile, TemporariesOfDeadProcessesAreRemovedOthersKept) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  std::string prefix = format::temporary_prefix(path);
  pid_t dead = dead_pid();
  write_bytes(prefix + std::to_string(dead) + "-7", "partial");
  write_bytes(prefix + std::to_string(dead), "partial, an older version's name");
  std::string live = prefix + std::to_string(::getpid()) + "-99";
  write_bytes(live, "another save in progress");
  write_bytes(dir.file("other.safetensors.tmp-instanttensor-1-1"), "not this path's");
  DurableFile file(path);
  file.write("x", 1);
  file.commit();
  EXPECT_EQ(
      entries(dir.path()),
      (std::vector<std::string>{
          "m.safetensors", "m.safetensors.tmp-instanttensor-" + std::to_string(::getpid()) + "-99",
          "other.safetensors.tmp-instanttensor-1-1"}));
}

TEST(DurableFile, AMissingFolderIsNotFoundNamingThePath) {
  TempDir dir;
  std::string path = dir.file("missing/m.safetensors");
  for (bool unnamed : {true, false}) {
    try {
      DurableFile file(path, unnamed);
      FAIL() << "opened a file in a missing folder";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::NotFound);
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace instanttensor
