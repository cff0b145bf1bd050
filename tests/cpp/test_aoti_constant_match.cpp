// Which checkpoint tensor fills which constant of an AOTInductor package: every refusal names
// the constant, the tensor and the file, before any byte is read.
#include <gtest/gtest.h>

#include "api/aoti_constant_match.h"
#include "instanttensor/error.h"

namespace instanttensor::aoti {
namespace {

std::vector<PackageConstant> package() {
  return {{"fc_weight", "fc.weight", c10::ScalarType::Float, std::nullopt},
          {"fc_bias", "fc.bias", c10::ScalarType::Float, std::nullopt}};
}

std::map<std::string, CheckpointTensor> checkpoint(const std::string& prefix = "") {
  return {{prefix + "fc.weight", {"a.safetensors", c10::ScalarType::Float, {4, 3}}},
          {prefix + "fc.bias", {"b.safetensors", c10::ScalarType::Float, {4}}}};
}

std::string same(const std::string& fqn) { return fqn; }

// The Error's kind and message of `body`, which must throw one.
template <typename Body>
std::pair<ErrorKind, std::string> refusal(Body body) {
  try {
    body();
  } catch (const Error& error) {
    return {error.kind(), error.what()};
  }
  ADD_FAILURE() << "no Error";
  return {ErrorKind::Internal, ""};
}

TEST(AotiConstantMatch, PairsEveryConstantWithItsTensor) {
  auto constants = package();
  auto tensors = checkpoint("model.");
  auto match = match_constants(
      constants, tensors, [](const std::string& fqn) { return "model." + fqn; }, true, "a, b");
  ASSERT_EQ(match.sources.size(), 2u);
  EXPECT_EQ(match.sources[0].tensor, "model.fc.weight");
  EXPECT_EQ(match.sources[0].source->file, "a.safetensors");
  EXPECT_EQ(match.sources[1].constant->name, "fc_bias");
  EXPECT_TRUE(match.unused_tensors.empty());
}

TEST(AotiConstantMatch, AConstantWithoutATensorIsAKeyErrorNamingItAndTheFiles) {
  auto constants = package();
  auto tensors = checkpoint();
  tensors.erase("fc.bias");
  auto [kind, message] = refusal([&] { match_constants(constants, tensors, same, false, "a, b"); });
  EXPECT_EQ(kind, ErrorKind::Key);
  EXPECT_NE(message.find("a, b"), std::string::npos) << message;
  EXPECT_NE(message.find("1 of the package's 2 constants"), std::string::npos) << message;
  EXPECT_NE(message.find("'fc.bias'"), std::string::npos) << message;
}

TEST(AotiConstantMatch, ARenamedConstantWithoutATensorNamesBothNames) {
  auto constants = package();
  auto tensors = checkpoint();
  auto [kind, message] = refusal([&] {
    match_constants(
        constants, tensors, [](const std::string& fqn) { return "x." + fqn; }, false, "a");
  });
  EXPECT_EQ(kind, ErrorKind::Key);
  EXPECT_NE(message.find("fc.weight (as 'x.fc.weight')"), std::string::npos) << message;
}

TEST(AotiConstantMatch, TensorsNoConstantTakesAreAnErrorOnlyWhenStrict) {
  auto constants = package();
  auto tensors = checkpoint();
  tensors["lm_head.weight"] = {"b.safetensors", c10::ScalarType::Half, {8, 3}};
  auto [kind, message] = refusal([&] { match_constants(constants, tensors, same, true, "a, b"); });
  EXPECT_EQ(kind, ErrorKind::Key);
  EXPECT_NE(message.find("'lm_head.weight'"), std::string::npos) << message;
  auto match = match_constants(constants, tensors, same, false, "a, b");
  EXPECT_EQ(match.unused_tensors, std::vector<std::string>{"lm_head.weight"});
}

TEST(AotiConstantMatch, ADtypeThatDiffersNamesTheTensorFileAndBothDtypes) {
  auto constants = package();
  auto tensors = checkpoint();
  tensors["fc.weight"].dtype = c10::ScalarType::BFloat16;
  auto [kind, message] = refusal([&] { match_constants(constants, tensors, same, true, "a, b"); });
  EXPECT_EQ(kind, ErrorKind::Argument);
  EXPECT_NE(message.find("a.safetensors: tensor 'fc.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("float32"), std::string::npos) << message;
  EXPECT_NE(message.find("bfloat16"), std::string::npos) << message;
}

TEST(AotiConstantMatch, AKnownShapeIsCheckedAtTheMatchAnUnknownOneAfterTheProbe) {
  auto constants = package();
  constants[1].shape = std::vector<int64_t>{5};
  auto tensors = checkpoint();
  auto [kind, message] = refusal([&] { match_constants(constants, tensors, same, true, "a, b"); });
  EXPECT_EQ(kind, ErrorKind::Argument);
  EXPECT_NE(message.find("b.safetensors: tensor 'fc.bias'"), std::string::npos) << message;
  EXPECT_NE(message.find("[5]"), std::string::npos) << message;
  EXPECT_NE(message.find("[4]"), std::string::npos) << message;

  constants = package();
  auto match = match_constants(constants, tensors, same, true, "a, b");
  EXPECT_NO_THROW(check_shapes(match, {{"fc.weight", {4, 3}}, {"fc.bias", {4}}}));
  auto [late_kind, late] = refusal([&] {
    check_shapes(match, {{"fc.weight", {3, 4}}, {"fc.bias", {4}}});
  });
  EXPECT_EQ(late_kind, ErrorKind::Argument);
  EXPECT_NE(late.find("has shape [3, 4], the checkpoint's tensor [4, 3]"), std::string::npos)
      << late;
}

TEST(AotiConstantMatch, TwoConstantsNamingOneTensorAreRefused) {
  auto constants = package();
  auto tensors = checkpoint();
  auto [kind, message] = refusal([&] {
    match_constants(
        constants, tensors, [](const std::string&) { return std::string("fc.weight"); }, false,
        "a");
  });
  EXPECT_EQ(kind, ErrorKind::Argument);
  EXPECT_NE(message.find("both constants"), std::string::npos) << message;
}

}  // namespace
}  // namespace instanttensor::aoti
