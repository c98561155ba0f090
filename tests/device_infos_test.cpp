// Rank metadata: DeviceInfo round-trips through its text encoding and the
// gather, whatever its names hold.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/scripted_comm.h"
#include "worker/comm/device_infos.h"

namespace vtrain::worker {
namespace {

DeviceInfo awkward(const std::string& name) {
  return {.backend = "cpu",
          .name = name,
          .memory_bytes = (size_t{3} << 40) + 7,
          .threads = 48,
          .library_version = "oneDNN 3.1|x, 2",
          .host = "node:7\n",
          .device_key = "0000:41:00.0",
          .cpus = {1, 3, 17}};
}

void expect_same(const DeviceInfo& a, const DeviceInfo& b) {
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  EXPECT_EQ(a.threads, b.threads);
  EXPECT_EQ(a.library_version, b.library_version);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.device_key, b.device_key);
  EXPECT_EQ(a.cpus, b.cpus);
}

TEST(DeviceInfos, AnyNameRoundTrips) {
  for (const std::string& name : std::vector<std::string>{"AMD EPYC (cpus 0,1) | rev 2", "", "3:abc", "a|b|c,d,e",
                                 std::string("nul\0inside", 10)}) {
    SCOPED_TRACE(name);
    expect_same(decode_device_info(encode_device_info(awkward(name))), awkward(name));
  }
}

TEST(DeviceInfos, MalformedTextNamesTheField) {
  const std::string good = encode_device_info(awkward("GPU|0,1"));
  const auto error = [](const std::string& text) {
    try {
      decode_device_info(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(good.substr(0, good.size() - 1)).find("field cpus"), std::string::npos);
  DeviceInfo no_cpus = awkward("x");
  no_cpus.cpus.clear();
  const std::string unlisted = encode_device_info(no_cpus);
  EXPECT_TRUE(decode_device_info(unlisted).cpus.empty());
  EXPECT_NE(error(unlisted.substr(0, unlisted.size() - 2) + "3:1:x").find("cpu: expected a number, got 'x'"),
            std::string::npos);
  EXPECT_NE(error(good + "x").find("1 bytes left"), std::string::npos);
  EXPECT_NE(error("3:cpu7:GPU|0,11:x1:12:v11:h").find("memory_bytes: expected a number, got 'x'"),
            std::string::npos);
  EXPECT_NE(error("").find("field backend at offset 0"), std::string::npos);
}

TEST(DeviceInfos, GatherKeepsRankOrderAndNames) {
  // Rank 0 of a job whose other ranks sent these.
  ScriptedComm comm(0, {"", encode_device_info(awkward("Tesla|K80, 0")),
                        encode_device_info(awkward(""))});
  const std::vector<DeviceInfo> all = gather_device_infos(comm, awkward("mine, |"));
  ASSERT_EQ(all.size(), 3u);
  expect_same(all[0], awkward("mine, |"));
  expect_same(all[1], awkward("Tesla|K80, 0"));
  expect_same(all[2], awkward(""));
}

}  // namespace
}  // namespace vtrain::worker
