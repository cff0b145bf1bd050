// Linked into the suites that CTest runs once per read backend (INSTANTTENSOR_BACKEND=...): before
// any test, checks that the backend named is the one in use. A silent fallback (O_DIRECT refused
// by the filesystem, io_uring blocked) would otherwise run the same pread path under every name;
// then the whole variant is skipped, saying why, instead of passing for the wrong reason.
#include <gtest/gtest.h>
#include <instanttensor/instanttensor.h>

#include <cstdlib>

#include "helper_files.h"

namespace instanttensor {
namespace {

class NamedBackendIsInUse : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* named = std::getenv("INSTANTTENSOR_BACKEND");
    if (named == nullptr) return;
    testing::TempDir dir;
    std::string path = dir.file("probe.safetensors");
    save_file({{"x", at::arange(1024, at::kFloat)}}, path);
    SafeOpen f(path);
    for (auto& item : f) (void)item;  // the backend starts, or falls back, at the first read
    std::string in_use = testing::read_backend(f.stats().backend);
    std::string name = named;
    bool direct = in_use.find("+O_DIRECT") != std::string::npos &&
                  in_use.find("refused") == std::string::npos;
    bool uring = in_use.rfind("io_uring", 0) == 0;
    std::string why;
    if (name == "mmap" && in_use != "mmap") {
      why = "the files cannot be mapped here (" + in_use + ")";
    } else if ((name == "direct" || name == "uring") && !direct) {
      why = "O_DIRECT is refused where the test files live (" + in_use + ")";
    } else if ((name == "uring" || name == "uring_buffered") && !uring) {
      why = "io_uring is unavailable here (" + in_use + ")";
    }
    if (!why.empty()) GTEST_SKIP() << "INSTANTTENSOR_BACKEND=" << name << ": " << why;
    // What is in use must be what was named, exactly.
    std::string expected = name == "direct"           ? "pread+O_DIRECT"
                           : name == "uring"          ? "io_uring+O_DIRECT"
                           : name == "uring_buffered" ? "io_uring"
                           : name == "auto"           ? in_use
                           : name == "mmap"           ? "mmap"
                                                      : "pread";  // pread, buffered
    EXPECT_EQ(in_use, expected) << "INSTANTTENSOR_BACKEND=" << name;
  }
};

const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new NamedBackendIsInUse);

}  // namespace
}  // namespace instanttensor
