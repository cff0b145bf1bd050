// The registered ops and the Loader class, driven from C++ (dispatcher and TorchScript).
#include <gtest/gtest.h>
#include <instanttensor/instanttensor.h>
#include <torch/script.h>

#include "helper_files.h"

namespace instanttensor {
namespace {

TEST(TorchOps, LoadTensorsThroughTheDispatcher) {
  testing::TempDir dir;
  std::map<std::string, at::Tensor> tensors = {{"w", at::randn({4, 3})}, {"b", at::arange(3)}};
  save_file(tensors, dir.file("m.safetensors"));
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("instanttensor::load_tensors", "");
  auto typed = op.typed<std::vector<at::Tensor>(std::vector<std::string>, std::vector<std::string>,
                                                c10::Device)>();
  auto out = typed.call({dir.file("m.safetensors")}, {"b", "w"}, c10::Device(c10::kCPU));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::equal(out[0], tensors["b"]));
  EXPECT_TRUE(at::equal(out[1], tensors["w"]));
}

TEST(TorchOps, LoaderClassThroughTheCustomClassRegistry) {
  // What TorchScript (and any C++ host of scripted code) sees: the class and its methods as
  // registered, called with IValues.
  testing::TempDir dir;
  std::map<std::string, at::Tensor> tensors = {
      {"a", at::randn({8, 8})}, {"b", at::randn({5})}, {"c", at::ones({2, 2}, at::kDouble)}};
  save_file(tensors, dir.file("m.safetensors"));
  auto cls = torch::getCustomClass("__torch__.torch.classes.instanttensor.Loader");
  ASSERT_TRUE(cls);
  for (bool copy : {true, false}) {
    auto object = c10::ivalue::Object::create(c10::StrongTypePtr(nullptr, cls), 1);
    c10::IValue none;
    cls->getMethod("__init__")({object, c10::List<std::string>({dir.file("m.safetensors")}),
                                c10::Device(c10::kCPU), copy, none, none, none, none, none, none,
                                none, none, none, false, false});
    auto& next = cls->getMethod("next");
    std::map<std::string, at::Tensor> seen;
    for (;;) {
      c10::IValue item = next({object});
      if (item.isNone()) break;
      auto elements = item.toTupleRef().elements();
      seen[elements[0].toStringRef()] = elements[1].toTensor().clone();
    }
    cls->getMethod("close")({object});
    ASSERT_EQ(seen.size(), tensors.size());
    for (auto& [name, t] : tensors) EXPECT_TRUE(at::equal(seen[name], t)) << name;
  }
}

TEST(SaveFile, AMetaTensorIsRefusedNamedAndTheOldFileStays) {
  testing::TempDir dir;
  std::string path = dir.file("keep.safetensors");
  save_file({{"old", at::ones({3})}}, path);
  std::string before = testing::read_bytes(path);
  std::map<std::string, at::Tensor> tensors = {
      {"a", at::zeros({2})}, {"m", at::empty({4}, at::TensorOptions().device(c10::kMeta))}};
  try {
    save_file(tensors, path);
    ADD_FAILURE() << "a meta tensor was saved";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Argument);
    EXPECT_NE(std::string(e.what()).find("tensor 'm'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("meta tensor"), std::string::npos) << e.what();
  }
  EXPECT_EQ(testing::read_bytes(path), before);
}

TEST(SafeOpenOptions, TheMetaDeviceIsAnArgumentErrorInWords) {
  testing::TempDir dir;
  save_file({{"w", at::ones({2})}}, dir.file("m.safetensors"));
  OpenOptions options;
  options.device = c10::Device(c10::kMeta);
  try {
    SafeOpen opened(dir.file("m.safetensors"), options);
    ADD_FAILURE() << "opened for the meta device";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Argument);
    EXPECT_NE(std::string(e.what()).find("device='meta'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace instanttensor
