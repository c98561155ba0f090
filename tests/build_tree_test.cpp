// Tests run the vtrain of the tree they were built in, whatever its folder is
// called (build/, build-cuda/, ../vtrain-oot): a CLI test must never pick up
// another build's binary.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/test_support.h"

namespace vtrain {
namespace {

namespace fs = std::filesystem;

TEST(BuildTree, TheBinaryUnderTestIsTheOneBuiltBesideThisTest) {
  if (std::getenv("VTRAIN_BINARY") != nullptr) GTEST_SKIP() << "VTRAIN_BINARY chooses the binary";
  const fs::path binary = fs::weakly_canonical(test_support::vtrain_binary());
  ASSERT_TRUE(fs::exists(binary)) << binary;
  // This test runs from <tree>/tests/; the vtrain under test is <tree>/vtrain.
  const fs::path tree = fs::canonical("/proc/self/exe").parent_path().parent_path();
  EXPECT_EQ(binary.parent_path(), tree);
}

TEST(BuildTree, TheSourcesAreTheOnesThisTestWasBuiltFrom) {
  if (std::getenv("VTRAIN_SOURCE_DIR") != nullptr) GTEST_SKIP() << "VTRAIN_SOURCE_DIR chooses them";
  EXPECT_TRUE(fs::exists(fs::path(test_support::source_dir()) / "tests" / "build_tree_test.cpp"));
}

}  // namespace
}  // namespace vtrain
