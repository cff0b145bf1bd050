// Loader and the public C++ API on the CPU: iteration, random access, copy and borrow.
#include <gtest/gtest.h>
#include <instanttensor/instanttensor.h>
#include <stdlib.h>
#include <unistd.h>

#include <optional>
#include <utility>
#include <vector>

#include "helper_files.h"
#include "helper_thread_group.h"

namespace instanttensor {
namespace {

using testing::TempDir;

bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor ac = a.contiguous(), bc = b.contiguous();
  return ac.nbytes() == bc.nbytes() &&
         (ac.nbytes() == 0 || std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0);
}

// O_DIRECT reads whole blocks: at most one block of widening on each side of every range. The
// mmap backend copies exactly what is wanted, or nothing where it hands out views of the mapping
// (iteration with copy=false, random access).
void expect_bytes_read(const Stats& stats, uint64_t wanted, uint64_t ranges, bool mapped_views) {
  if (testing::read_backend(stats.backend) == "mmap") {
    EXPECT_EQ(stats.bytes_read, mapped_views ? 0u : wanted);
    return;
  }
  EXPECT_GE(stats.bytes_read, wanted);
  EXPECT_LE(stats.bytes_read, wanted + ranges * 2 * 4096) << stats.backend;
}

// A small model-like checkpoint in two files, plus the tensors it was written from.
struct ModelFiles {
  std::vector<std::string> files;
  std::map<std::string, at::Tensor> tensors;
};

ModelFiles write_model(const TempDir& dir, int layers = 6) {
  at::manual_seed(0);
  ModelFiles model;
  std::map<std::string, at::Tensor> first, second;
  first["embed.weight"] = at::randn({128, 32}).to(at::kBFloat16);
  for (int i = 0; i < layers; ++i) {
    auto& target = i < layers / 2 ? first : second;
    std::string p = "layers." + std::to_string(i) + ".";
    target[p + "attn.weight"] = at::randn({32, 32});
    target[p + "mlp.weight"] = at::randn({48, 32}).to(at::kHalf);
    target[p + "norm.weight"] = at::randn({32});
    target[p + "step"] = at::tensor(int64_t{i});
  }
  second["head.bias"] = at::randint(0, 255, {7}, at::kByte);
  second["empty"] = at::empty({0, 4});
  model.files = {dir.file("model-00002.safetensors"), dir.file("model-00001.safetensors")};
  save_file(first, dir.file("model-00001.safetensors"),
            std::map<std::string, std::string>{{"format", "pt"}});
  save_file(second, dir.file("model-00002.safetensors"));
  model.tensors = first;
  model.tensors.insert(second.begin(), second.end());
  return model;
}

OpenOptions borrow(int64_t buffer_size) {
  OpenOptions options;
  options.copy = false;
  options.buffer_size = buffer_size;
  return options;
}

TEST(Loader, IteratesEveryTensorInStorageOrderAndRepeats) {
  TempDir dir;
  auto model = write_model(dir);
  for (bool copy : {true, false}) {
    SCOPED_TRACE(copy ? "copy" : "borrow");
    OpenOptions options;
    options.copy = copy;
    SafeOpen f(model.files, options);
    // File 00001 first; inside it the writer put 8-byte-aligned I64 scalars first.
    EXPECT_EQ(f.offset_keys().front(), "layers.0.step");
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<std::string> seen;
      for (auto& [name, tensor] : f) {
        ASSERT_TRUE(model.tensors.count(name)) << name;
        EXPECT_TRUE(same_bytes(tensor, model.tensors[name])) << name;
        seen.push_back(name);
      }
      EXPECT_EQ(seen, f.offset_keys());
    }
    auto keys = f.keys();
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
    EXPECT_EQ(keys.size(), model.tensors.size());
    uint64_t total = 0;
    for (auto& [name, t] : model.tensors) total += t.nbytes();
    EXPECT_EQ(f.total_tensor_size(), total);
    expect_bytes_read(f.stats(), 2 * total, 2 * keys.size(), /*mapped_views=*/!copy);
  }
}

TEST(Loader, RandomAccessInAnyOrderAndMetadata) {
  TempDir dir;
  auto model = write_model(dir);
  SafeOpen f(model.files, borrow(1 << 20));
  auto keys = f.keys();
  std::reverse(keys.begin(), keys.end());
  for (const auto& name : keys) {
    at::Tensor t = f.get_tensor(name);
    EXPECT_TRUE(same_bytes(t, model.tensors[name])) << name;
    auto meta = f.get_tensor_metadata(name);
    EXPECT_EQ(meta.dtype, model.tensors[name].scalar_type());
    EXPECT_EQ(meta.shape, model.tensors[name].sizes().vec());
  }
  EXPECT_TRUE(same_bytes(f.get_tensor("head.bias"), model.tensors["head.bias"]));
  auto meta = f.metadata();
  ASSERT_TRUE(meta.has_value());
  EXPECT_EQ(meta->at("format"), "pt");
  try {
    f.get_tensor("missing.weight");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Key);
    EXPECT_NE(std::string(e.what()).find("missing.weight"), std::string::npos);
  }
}

// Runs once per read backend (CTest variants): rows of dimension 0 read as one byte range.
TEST(Loader, GetRowsReadsOnlyThoseRowsAndMatchesTheSlice) {
  TempDir dir;
  auto model = write_model(dir);
  SafeOpen f(model.files);
  const at::Tensor& embed = model.tensors["embed.weight"];  // 128 x 32 bf16: 64 B per row
  for (auto [start, stop] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 128}, {5, 6}, {17, 90}, {127, 128}, {40, 40}}) {
    auto before = f.stats();
    at::Tensor rows = f.get_rows("embed.weight", start, stop);
    auto after = f.stats();
    EXPECT_TRUE(same_bytes(rows, embed.slice(0, start, stop))) << start << ":" << stop;
    EXPECT_TRUE(rows.is_contiguous());
    expect_bytes_read(after, before.bytes_read + static_cast<uint64_t>(stop - start) * 64,
                      stop > start ? 1 : 0, /*mapped_views=*/true);
  }
  EXPECT_TRUE(same_bytes(f.get_rows("head.bias", 2, 5), model.tensors["head.bias"].slice(0, 2, 5)));
  EXPECT_EQ(f.get_rows("empty", 0, 0).sizes(), (std::vector<int64_t>{0, 4}));
  for (auto [start, stop] : std::vector<std::pair<int64_t, int64_t>>{{-1, 2}, {3, 2}, {0, 129}}) {
    try {
      f.get_rows("embed.weight", start, stop);
      ADD_FAILURE() << start << ":" << stop;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Argument);
      EXPECT_NE(std::string(e.what()).find("embed.weight"), std::string::npos);
    }
  }
}

// Runs once per read backend: destinations filled in place, errors before any byte is written.
TEST(Loader, LoadIntoFillsDestinationsInPlace) {
  TempDir dir;
  auto model = write_model(dir);
  for (bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "staged" : "direct to the destination");
    OpenOptions options;
    options.force_staging = staged;
    options.staging_size = 32 << 10;
    SafeOpen f(model.files, options);
    std::map<std::string, at::Tensor> destinations;
    for (const auto& [name, t] : model.tensors) destinations[name] = at::zeros_like(t);
    std::map<std::string, void*> pointers;
    for (auto& [name, t] : destinations) pointers[name] = t.data_ptr();
    auto result = f.load_into(destinations);
    EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
    for (const auto& [name, t] : destinations) {
      EXPECT_EQ(t.data_ptr(), pointers[name]) << name;
      EXPECT_TRUE(same_bytes(t, model.tensors[name])) << name;
    }
    // A wrong shape: nothing is written anywhere.
    std::map<std::string, at::Tensor> bad;
    for (const auto& [name, t] : model.tensors) bad[name] = at::zeros_like(t);
    bad["layers.1.attn.weight"] = at::zeros({32, 31});
    try {
      f.load_into(bad);
      ADD_FAILURE() << "a wrong shape went unnoticed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Argument);
      EXPECT_NE(std::string(e.what()).find("layers.1.attn.weight"), std::string::npos) << e.what();
    }
    for (const auto& [name, t] : bad) EXPECT_FALSE(t.any().item<bool>()) << name;
    // Names on one side only: Key when strict, reported otherwise.
    std::map<std::string, at::Tensor> partial{{"head.bias", at::zeros({7}, at::kByte)},
                                              {"nope", at::zeros({1})}};
    EXPECT_THROW(f.load_into(partial), Error);
    auto left = f.load_into(partial, /*strict=*/false);
    EXPECT_EQ(left.missing_keys, std::vector<std::string>{"nope"});
    EXPECT_EQ(left.unexpected_keys.size(), model.tensors.size() - 1);
    EXPECT_TRUE(same_bytes(partial["head.bias"], model.tensors["head.bias"]));
  }
}

TEST(Loader, CopiedTensorsOwnExactlyTheirBytes) {
  TempDir dir;
  auto model = write_model(dir);
  SafeOpen f(model.files);
  std::vector<at::Tensor> kept;
  at::Tensor embed;
  for (auto& [name, tensor] : f) {
    kept.push_back(tensor);
    if (name == "embed.weight") embed = tensor;
  }
  f.close();
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i].storage().nbytes(), kept[i].nbytes());
    EXPECT_EQ(kept[i].storage().use_count(), 1);
    EXPECT_TRUE(kept[i].is_contiguous());
    // 64-byte aligned from buffered reads; O_DIRECT reads land whole blocks, so the data sits
    // at its file offset modulo the block: still aligned for its element type.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(kept[i].data_ptr()) % kept[i].element_size(), 0u);
  }
  EXPECT_TRUE(same_bytes(embed, model.tensors["embed.weight"]));
}

TEST(Loader, ConsumerThatDropsEachTensorCausesNoMaterialization) {
  TempDir dir;
  auto model = write_model(dir, 40);
  SafeOpen f(model.files, borrow(16 << 10));
  uint64_t checksum = 0;
  for (auto& [name, tensor] : f) {
    at::Tensor copy = tensor.clone();  // what a parameter loader does
    checksum += static_cast<uint64_t>(copy.numel());
    EXPECT_TRUE(same_bytes(copy, model.tensors[name])) << name;
  }
  Stats s = f.stats();
  EXPECT_GT(checksum, 0u);
  EXPECT_EQ(s.materializations, 0u);
  EXPECT_LE(s.peak_pool_bytes, 16u << 10);
  EXPECT_EQ(s.buffer_size, 16u << 10);
}

TEST(Loader, RetainedBorrowedTensorsSurviveManyWraps) {
  TempDir dir;
  auto model = write_model(dir, 40);
  uint64_t total = 0;
  for (auto& [name, t] : model.tensors) total += t.nbytes();
  const int64_t buffer = 16 << 10;
  ASSERT_GT(total, 5u * buffer);  // the ring wraps several times
  SafeOpen f(model.files, borrow(buffer));
  std::vector<std::pair<std::string, at::Tensor>> kept;
  std::vector<at::Tensor> views;
  for (auto& item : f) {
    kept.push_back(item);
    views.push_back(item.second.view({-1}).narrow(0, 0, std::min<int64_t>(item.second.numel(), 2)));
  }
  Stats s = f.stats();
  // Views of a file mapping have no ring to wrap. Host views kept: leased, or copied out where
  // the kernel refuses the lease.
  EXPECT_EQ(s.materializations + s.leased_views > 0, s.backend != "mmap") << s.backend;
  EXPECT_LE(s.peak_pool_bytes, static_cast<uint64_t>(buffer));
  for (auto& [name, tensor] : kept) EXPECT_TRUE(same_bytes(tensor, model.tensors[name])) << name;
  // Views share the storage, so they follow the repointed memory too.
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i].second.numel() == 0) continue;
    EXPECT_EQ(views[i].data_ptr(), kept[i].second.data_ptr()) << kept[i].first;
  }
  f.close();  // the remaining borrowed tensors are copied out before the ring is freed
  for (auto& [name, tensor] : kept) EXPECT_TRUE(same_bytes(tensor, model.tensors[name])) << name;
}

TEST(Loader, HoldingTheLiveItemOnlyIsFree) {
  TempDir dir;
  auto model = write_model(dir, 40);
  SafeOpen f(model.files, borrow(1 << 20));  // enough for the live item plus read-ahead
  std::optional<std::pair<std::string, at::Tensor>> item;
  while ((item = f.next())) {
    EXPECT_TRUE(same_bytes(item->second, model.tensors[item->first]));
  }
  // Through a ring nothing is copied. Views of the page cache: `item` still holds the last
  // (small) tensor when the call that ends the pass settles it, so that one is kept under a
  // lease on its file (or copied out where the kernel refuses the lease).
  Stats s = f.stats();
  EXPECT_EQ(s.materializations + s.leased_views, testing::iterates_views(s.backend) ? 1u : 0u)
      << s.backend;
}

TEST(Loader, TinyBufferStillProgressesAndStaysCorrect) {
  TempDir dir;
  auto model = write_model(dir, 4);
  uint64_t largest = 0;
  for (auto& [name, t] : model.tensors) largest = std::max<uint64_t>(largest, t.nbytes());
  // One tensor at a time: the largest plus placement slack (up to 4 KiB O_DIRECT blocks).
  const uint64_t buffer = largest + 3 * 4096;
  SafeOpen f(model.files, borrow(static_cast<int64_t>(buffer)));
  std::map<std::string, at::Tensor> kept;
  for (auto& [name, tensor] : f) kept[name] = tensor;
  for (auto& [name, tensor] : kept) EXPECT_TRUE(same_bytes(tensor, model.tensors[name])) << name;
  EXPECT_LE(f.stats().peak_pool_bytes, buffer);
}

TEST(Loader, BufferTooSmallForATensorIsAClearErrorBeforeAllocation) {
  TempDir dir;
  auto model = write_model(dir);
  try {
    SafeOpen f(model.files, borrow(1024));
    // Views of the page cache hold no ring: 1024 bytes is only their read-ahead window (the
    // read backends' variants of this test meet the ring's refusal).
    Stats s = f.stats();
    EXPECT_TRUE(testing::iterates_views(s.backend)) << s.backend;
    for (auto& [name, tensor] : f) EXPECT_TRUE(same_bytes(tensor, model.tensors[name])) << name;
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Argument);
    EXPECT_NE(message.find("embed.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("model-00001.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("buffer_size=1024"), std::string::npos) << message;
  }
}

TEST(Loader, KeySelectionReadsOnlyTheSelectedBytes) {
  TempDir dir;
  auto model = write_model(dir);
  for (bool copy : {true, false}) {
    OpenOptions options;
    options.copy = copy;
    options.keys = std::vector<std::string>{"layers.4.mlp.weight", "layers.0.norm.weight"};
    SafeOpen f(model.files, options);
    EXPECT_EQ(f.keys(), (std::vector<std::string>{"layers.0.norm.weight", "layers.4.mlp.weight"}));
    std::vector<std::string> seen;
    for (auto& [name, tensor] : f) {
      seen.push_back(name);
      EXPECT_TRUE(same_bytes(tensor, model.tensors[name]));
    }
    EXPECT_EQ(seen, f.offset_keys());
    uint64_t expected = model.tensors["layers.4.mlp.weight"].nbytes() +
                        model.tensors["layers.0.norm.weight"].nbytes();
    EXPECT_EQ(f.total_tensor_size(), expected);
    expect_bytes_read(f.stats(), expected, 2, /*mapped_views=*/!copy);
    EXPECT_THROW(f.get_tensor("embed.weight"), Error);
  }
  OpenOptions unknown;
  unknown.keys = std::vector<std::string>{"nope"};
  EXPECT_THROW(SafeOpen(model.files, unknown), Error);
}

// U8 "pad" at 0, then F32 "x" at data offset 1: legal, and misaligned in memory.
std::string write_misaligned(const TempDir& dir, at::Tensor* x) {
  *x = at::arange(10, at::kFloat);
  std::string header =
      "{\"pad\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
      "\"x\":{\"dtype\":\"F32\",\"shape\":[10],\"data_offsets\":[1,41]}}";
  std::string data(1, '\x07');
  data.append(static_cast<const char*>(x->data_ptr()), 40);
  std::string path = dir.file("misaligned.safetensors");
  testing::write_bytes(path, testing::safetensors_bytes(header, data));
  return path;
}

TEST(Loader, MisalignedDataStillYieldsACorrectAlignedTensor) {
  TempDir dir;
  at::Tensor x;
  std::string path = write_misaligned(dir, &x);
  for (bool copy : {true, false}) {
    OpenOptions options;
    options.copy = copy;
    SafeOpen f(path, options);
    for (auto& [name, tensor] : f) {
      if (name != "x") continue;
      EXPECT_TRUE(same_bytes(tensor, x));
      EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 4, 0u);
    }
    EXPECT_TRUE(same_bytes(f.get_tensor("x"), x));
    // Buffered reads land each tensor where its own storage (copy) or its file alignment (the
    // borrow ring) puts it; O_DIRECT reads land on a block, where x sits at file offset % block.
    // The mmap backend's views sit at the file offset, for iteration (copy=false) and random
    // access alike; so do the views of the page cache a host iteration hands out.
    const std::string& backend = f.stats().backend;
    bool direct = backend.find("O_DIRECT") != std::string::npos;
    bool mapped = testing::read_backend(backend) == "mmap";
    bool views = testing::iterates_views(backend) || (mapped && !copy);
    uint64_t iteration = views || direct ? 1u : (copy ? 0u : 1u);
    uint64_t random_access = direct || mapped ? 1u : 0u;
    EXPECT_EQ(f.stats().misaligned_copies, iteration + random_access) << backend;
  }
}

TEST(Loader, PackedAndUnrepresentableDtypes) {
  TempDir dir;
  std::string header =
      "{\"f4\":{\"dtype\":\"F4\",\"shape\":[2,4],\"data_offsets\":[0,4]},"
      "\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[4,7]},"
      "\"u\":{\"dtype\":\"U16\",\"shape\":[1],\"data_offsets\":[7,9]}}";
  std::string path = dir.file("packed.safetensors");
  testing::write_bytes(path, testing::safetensors_bytes(header, "abcdefghi"));
  SafeOpen f(path);
  at::Tensor f4 = f.get_tensor("f4");
  EXPECT_EQ(f4.scalar_type(), at::kFloat4_e2m1fn_x2);
  EXPECT_EQ(f4.sizes().vec(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::string(static_cast<char*>(f4.data_ptr()), 4), "abcd");
  try {
    f.get_tensor("f6");
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("F6_E2M3"), std::string::npos) << message;
    EXPECT_NE(message.find("'f6'"), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
  }
  // Iteration skips past the unrepresentable tensor after reporting it.
  std::vector<std::string> seen;
  f.restart();
  for (;;) {
    try {
      auto item = f.next();
      if (!item) break;
      seen.push_back(item->first);
    } catch (const Error&) {
      seen.push_back("error");
    }
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"f4", "error", "u"}));
  // Round trip through save_file keeps the packed layout.
  save_file({{"f4", f4}}, dir.file("f4.safetensors"));
  SafeOpen again(dir.file("f4.safetensors"));
  EXPECT_TRUE(same_bytes(again.get_tensor("f4"), f4));
}

TEST(Loader, FileChangedAfterOpenIsReportedWithItsName) {
  TempDir dir;
  auto model = write_model(dir);
  SafeOpen f(model.files);
  ASSERT_EQ(::truncate(model.files[0].c_str(), 100), 0);  // model-00002
  try {
    for (auto& item : f) (void)item;
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Loader, FileShrinkingDuringTheLoadIsAShortReadError) {
  TempDir dir;
  auto model = write_model(dir, 40);
  OpenOptions options;
  options.buffer_size = 1;  // read ahead one tensor at a time
  SafeOpen f(model.files, options);
  ASSERT_TRUE(f.next().has_value());  // the pass has started and passed its checks
  ASSERT_EQ(::truncate(model.files[1].c_str(), 4096), 0);  // model-00001, being read now
  ASSERT_EQ(::truncate(model.files[0].c_str(), 4096), 0);
  try {
    while (f.next()) {
    }
    ADD_FAILURE();
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(message.find("model-0000"), std::string::npos) << message;
    EXPECT_NE(message.find("tensor '"), std::string::npos) << message;
  }
  EXPECT_THROW(f.next(), Error);  // the failed pass stays failed
}

TEST(Loader, ResourcesAreReleasedOnEveryPath) {
  TempDir dir;
  auto model = write_model(dir);
  // The lease watcher (io/file_lease.h) is one thread per process from the first lease on, by
  // design: a host pass first makes it part of the count.
  for (auto& item : SafeOpen(model.files)) (void)item;
  int fds = testing::open_fd_count();
  int threads = testing::thread_count();
  for (int i = 0; i < 50; ++i) {
    SafeOpen f(model.files, borrow(1 << 20));
    auto first = f.next();  // abandon the iteration half way
    ASSERT_TRUE(first.has_value());
  }
  for (int i = 0; i < 20; ++i) {
    EXPECT_THROW(SafeOpen(std::vector<std::string>{model.files[0], dir.file("missing")}), Error);
  }
  EXPECT_EQ(testing::open_fd_count(), fds);
  // io_uring's kernel workers (iou-wrk) leave a moment after the ring is closed.
  for (int i = 0; i < 3000 && testing::thread_count() > threads; ++i) ::usleep(10000);
  EXPECT_LE(testing::thread_count(), threads);  // kernel workers may leave early, too
  SafeOpen f(model.files);
  f.close();
  f.close();
  EXPECT_THROW(f.next(), Error);
  EXPECT_EQ(testing::open_fd_count(), fds);
}

TEST(Options, BadValuesNameTheOptionOrVariable) {
  TempDir dir;
  auto model = write_model(dir);
  OpenOptions negative;
  negative.chunk_size = -5;
  EXPECT_THROW(SafeOpen(model.files, negative), Error);
  OpenOptions backend;
  backend.backend = "warp-drive";
  try {
    SafeOpen f(model.files, backend);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pread"), std::string::npos) << e.what();
  }
  ::setenv("INSTANTTENSOR_CHUNK_SIZE", "12Q", 1);
  try {
    SafeOpen f(model.files);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Argument);
    EXPECT_NE(std::string(e.what()).find("INSTANTTENSOR_CHUNK_SIZE"), std::string::npos);
  }
  ::setenv("INSTANTTENSOR_CHUNK_SIZE", "1K", 1);  // valid: small chunks, same bytes
  {
    OpenOptions reads;  // iteration through the read path, not views of the page cache
    reads.backend = "pread";
    SafeOpen f(model.files, reads);
    for (auto& [name, t] : f) EXPECT_TRUE(same_bytes(t, model.tensors[name]));
    EXPECT_GT(f.stats().read_requests, f.keys().size() + 10);
  }
  ::unsetenv("INSTANTTENSOR_CHUNK_SIZE");
  ::setenv("INSTANTTENSOR_DEBUG", "yes", 1);
  EXPECT_THROW(SafeOpen(model.files), Error);
  ::unsetenv("INSTANTTENSOR_DEBUG");
  OpenOptions explicit_wins;
  explicit_wins.concurrency = 2;
  ::setenv("INSTANTTENSOR_CONCURRENCY", "bad", 1);
  EXPECT_NO_THROW(SafeOpen(model.files, explicit_wins));
  ::unsetenv("INSTANTTENSOR_CONCURRENCY");
}

TEST(Files, LoadFileAndSaveFileRoundTrip) {
  TempDir dir;
  std::map<std::string, at::Tensor> tensors = {
      {"a", at::randn({3, 5})},
      {"b", at::arange(6, at::kLong)},
      {"c", at::ones({2}, at::kBool)},
      {"d", at::randn({4}).to(at::kFloat8_e4m3fn)},
      {"e", at::randn({2, 2}, at::kComplexFloat)},
  };
  save_file(tensors, dir.file("x.safetensors"), std::map<std::string, std::string>{{"k", "v"}});
  auto loaded = load_file(dir.file("x.safetensors"));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (auto& [name, t] : tensors) EXPECT_TRUE(same_bytes(loaded[name], t)) << name;

  // Over 1 MiB the file takes the loader's pass rather than a read per tensor: the same bytes,
  // owned (plan::choose_load_file_path).
  std::map<std::string, at::Tensor> large = {{"p", at::randn({1 << 18})}, {"q", at::randn({7})}};
  save_file(large, dir.file("large.safetensors"));
  auto loaded_large = load_file(dir.file("large.safetensors"));
  ASSERT_EQ(loaded_large.size(), 2u);
  for (auto& [name, t] : large) EXPECT_TRUE(same_bytes(loaded_large[name], t)) << name;
  EXPECT_THROW(load_file(dir.file("absent.safetensors")), Error);

  at::Tensor base = at::randn({4, 4});
  EXPECT_THROW(save_file({{"t", base.t()}}, dir.file("y.safetensors")), Error);
  EXPECT_THROW(save_file({{"p", base[0]}, {"q", base}}, dir.file("y.safetensors")), Error);
  EXPECT_NO_THROW(save_file({{"p", base[0]}, {"q", base[1]}}, dir.file("y.safetensors")));
}

// A group sees only its own ranks: a process alone in the group it was given, which a launcher
// started beside others (LOCAL_WORLD_SIZE), shares the host's page cache with them, so a
// checkpoint larger than memory keeps its pages cached (no POSIX_FADV_DONTNEED behind).
TEST(Loader, AGroupOfOneBesideALaunchersOtherProcessesDropsNoPageCache) {
  TempDir dir;
  at::manual_seed(3);
  std::map<std::string, at::Tensor> tensors;
  for (int i = 0; i < 3; ++i) tensors["w" + std::to_string(i)] = at::randn({1 << 20});  // 12 MiB
  const std::string path = dir.file("big.safetensors");
  save_file(tensors, path);
  // The launcher variables and the memory limit as they were, whatever the test's outcome.
  struct Environment {
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    Environment() {
      for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                               "INSTANTTENSOR_TESTING_MEMORY_BYTES"}) {
        const char* value = std::getenv(name);
        saved.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
        ::unsetenv(name);
      }
    }
    ~Environment() {
      for (const auto& [name, value] : saved) {
        value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str());
      }
    }
  } environment;
  ::setenv("INSTANTTENSOR_TESTING_MEMORY_BYTES", std::to_string(8 << 20).c_str(), 1);
  for (const auto& [local_size, dropped] : {std::pair{"2", false}, std::pair{"1", true}}) {
    ::setenv("LOCAL_WORLD_SIZE", local_size, 1);
    OpenOptions options;
    options.process_group = testing::thread_group(1)[0];
    options.backend = "auto";  // views of the page cache, under every backend variant's name
    SafeOpen f({path}, options);
    while (auto item = f.next()) {
      EXPECT_TRUE(same_bytes(item->second, tensors.at(item->first))) << item->first;
    }
    const std::string& backend = f.stats().backend;
    EXPECT_EQ(backend.find("POSIX_FADV_DONTNEED behind") != std::string::npos, dropped)
        << local_size << ": " << backend;
  }
}

}  // namespace
}  // namespace instanttensor
