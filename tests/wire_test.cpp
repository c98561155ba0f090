// Typed messages between ranks (worker/comm/wire.h): the field codec, each
// message type's encode/decode pair (round trip; a short or malformed
// message is a WireError naming the message, never a crash or a wrong
// value), and the collectives that carry them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "tests/scripted_comm.h"
#include "worker/comm/device_infos.h"
#include "worker/comm/wire.h"
#include "worker/profile/planning.h"
#include "worker/train/resume_position.h"

namespace vtrain::worker {
namespace {

// The text of the WireError that decoding `bytes` as a T throws, or "no error".
template <typename T>
std::string decode_error(const std::string& bytes) {
  try {
    decode_message<T>(bytes);
  } catch (const WireError& e) {
    return e.what();
  }
  return "no error";
}

// Every cut of a good message, and a byte too many, is an error that
// starts with the message's name.
template <typename T>
void expect_cuts_fail(const T& value) {
  const std::string good = encode_message(value);
  const std::string name = WireFormat<T>::kName;
  for (size_t n = 0; n < good.size(); ++n) {
    SCOPED_TRACE(name + " cut to " + std::to_string(n) + " of " + std::to_string(good.size()));
    EXPECT_EQ(decode_error<T>(good.substr(0, n)).rfind(name + ": field ", 0), 0u);
  }
  EXPECT_EQ(decode_error<T>(good + "1:x"), name + ": 3 bytes left after the last field");
}

TEST(Wire, FieldsRoundTripWhateverTheyHold) {
  WireWriter out;
  const std::vector<std::string> texts{"", "12:34", std::string("nul\0in", 6), "a|b,c\n"};
  for (const std::string& t : texts) out.text(t);
  out.number(std::numeric_limits<int64_t>::min());
  out.number(std::numeric_limits<uint64_t>::max());
  const std::vector<double> reals{0.1,     1.0 / 3.0, std::ldexp(1.0, -24),
                                  65536.0, -0.0,      std::numeric_limits<double>::denorm_min(),
                                  std::numeric_limits<double>::max(),
                                  std::numeric_limits<double>::infinity()};
  for (double r : reals) out.real(r);
  out.flag(true);
  out.flag(false);
  out.numbers(std::vector<int>{-3, 0, 17});
  out.numbers(std::vector<int64_t>{});

  WireReader in(out.bytes(), "test");
  for (const std::string& t : texts) EXPECT_EQ(in.text("t"), t);
  EXPECT_EQ(in.number<int64_t>("min"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(in.number<uint64_t>("max"), std::numeric_limits<uint64_t>::max());
  for (double r : reals) {
    const double back = in.real("r");
    EXPECT_EQ(back, r);
    EXPECT_EQ(std::signbit(back), std::signbit(r));
  }
  EXPECT_TRUE(in.flag("yes"));
  EXPECT_FALSE(in.flag("no"));
  EXPECT_EQ(in.numbers<int>("list", "entry"), (std::vector<int>{-3, 0, 17}));
  EXPECT_TRUE(in.numbers<int64_t>("empty", "entry").empty());
  EXPECT_TRUE(in.at_end());
  in.expect_end();
}

TEST(Wire, FieldsOfTheWrongTypeAreErrorsNamingTheField) {
  const auto error = [](const std::string& bytes, const auto& read) {
    WireReader in(bytes, "test message");
    try {
      read(in);
    } catch (const WireError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("1:x", [](WireReader& in) { in.number<int>("count"); }),
            "test message: field count: expected a number, got 'x'");
  EXPECT_EQ(error("3:300", [](WireReader& in) { in.number<int8_t>("small"); }),
            "test message: field small: expected a number, got '300'");
  EXPECT_EQ(error("2:-1", [](WireReader& in) { in.number<uint32_t>("size"); }),
            "test message: field size: expected a number, got '-1'");
  EXPECT_EQ(error("0:", [](WireReader& in) { in.number<int>("count"); }),
            "test message: field count: expected a number, got ''");
  EXPECT_EQ(error("3:1.5", [](WireReader& in) { in.flag("on"); }),
            "test message: field on: expected a flag (0 or 1), got '1.5'");
  EXPECT_EQ(error("2:1e", [](WireReader& in) { in.real("scale"); }),
            "test message: field scale: expected a real number, got '1e'");
  EXPECT_EQ(error("3:1:x", [](WireReader& in) { in.numbers<int>("cpus", "cpu"); }),
            "test message: field cpu: expected a number, got 'x'");
  // A length that does not fit, or runs past the end, or is not a number.
  for (const std::string& bytes : {std::string("99999999999999999999999:x"), std::string("5:abc"),
                                   std::string("x:"), std::string(":"), std::string("7")}) {
    SCOPED_TRACE(bytes);
    EXPECT_EQ(error(bytes, [](WireReader& in) { in.text("name"); }),
              "test message: field name at offset 0: expected LENGTH:BYTES within the " +
                  std::to_string(bytes.size()) + " bytes of the message");
  }
}

TEST(Wire, EveryMessageRoundTrips) {
  EXPECT_EQ(decode_message<perfdb::DeviceId>(encode_message(perfdb::DeviceId{123456789012})),
            perfdb::DeviceId{123456789012});
  for (const std::vector<int64_t>& batch :
       {std::vector<int64_t>{48, 0, 16}, std::vector<int64_t>{}, std::vector<int64_t>{1}}) {
    EXPECT_EQ(decode_message<SplitShares>(encode_message(SplitShares{batch})).batch, batch);
  }
  for (const std::optional<LossScalerState>& scaler :
       {std::optional<LossScalerState>{}, std::optional<LossScalerState>{{65536.0, 3, 7}},
        std::optional<LossScalerState>{{0.1, 0, std::numeric_limits<int64_t>::max()}}}) {
    const ResumePosition position{1000, 7, 25, 3, scaler};
    const ResumePosition back = decode_message<ResumePosition>(encode_message(position));
    EXPECT_EQ(back.step, 1000);
    EXPECT_EQ(back.epoch, 7);
    EXPECT_EQ(back.step_in_epoch, 25);
    EXPECT_EQ(back.world_size, 3);
    EXPECT_EQ(back.loss_scaler, scaler);
  }
  for (const auto& [precision, name] : common::kPrecisionNames) {
    EXPECT_EQ(decode_message<common::Precision>(encode_message(precision)), precision) << name;
  }
  Checkpoint ckpt;
  ckpt.step = 12;
  ckpt.epoch = 2;
  ckpt.step_in_epoch = 4;
  ckpt.world_size = 5;
  ckpt.loss_scaler = LossScalerState{1024.0, 1, 2};
  const ResumePosition from = resume_position(ckpt);
  EXPECT_EQ(from.step, 12);
  EXPECT_EQ(from.epoch, 2);
  EXPECT_EQ(from.step_in_epoch, 4);
  EXPECT_EQ(from.world_size, 5);
  EXPECT_EQ(from.loss_scaler, ckpt.loss_scaler);
}

TEST(Wire, ShortOrMalformedMessagesAreErrorsNamingTheMessage) {
  expect_cuts_fail(perfdb::DeviceId{42});
  expect_cuts_fail(SplitShares{{48, 0, 16}});
  expect_cuts_fail(ResumePosition{10, 1, 2, 2, std::nullopt});
  expect_cuts_fail(ResumePosition{10, 1, 2, 2, LossScalerState{0.5, 1, 2}});
  expect_cuts_fail(DeviceInfo{.backend = "cpu",
                              .name = "AMD EPYC (cpus 0,1)",
                              .memory_bytes = 1 << 20,
                              .threads = 2,
                              .library_version = "oneDNN 3",
                              .host = "node",
                              .device_key = "",
                              .cpus = {0, 1}});
  expect_cuts_fail(common::Precision::kBf16);
  // A precision travels as its name: a code (what ranks once summed as
  // doubles) or an unknown name is an error listing the known ones.
  EXPECT_EQ(decode_error<common::Precision>("1:2"),
            "precision: field precision: expected one of fp32, tf32, bf16, fp16, got '2'");
  EXPECT_EQ(decode_error<common::Precision>("4:fp64"),
            "precision: field precision: expected one of fp32, tf32, bf16, fp16, got 'fp64'");
  EXPECT_EQ(decode_error<perfdb::DeviceId>("3:abc"),
            "perf DB device id: field value: expected a number, got 'abc'");
  EXPECT_EQ(decode_error<SplitShares>("7:2:481:x"),
            "batch split: field rank's batch: expected a number, got 'x'");
  // The text a rank sent before typed messages: "48,16".
  EXPECT_EQ(decode_error<SplitShares>("48,16"),
            "batch split: field batch at offset 0: expected LENGTH:BYTES within the 5 bytes of "
            "the message");
  EXPECT_EQ(decode_error<ResumePosition>("2:101:11:21:21:2"),
            "resume position: field loss_scaler: expected a flag (0 or 1), got '2'");
}

TEST(Wire, CollectivesCarryTypedMessagesAndNameTheSender) {
  // Rank 0 gathers every rank's id, in rank order; the others get nothing.
  ScriptedComm root(0, {"", encode_message(perfdb::DeviceId{7}), encode_message(perfdb::DeviceId{9})});
  const std::vector<perfdb::DeviceId> ids = gather_messages(root, perfdb::DeviceId{5}, 0);
  EXPECT_EQ(ids, (std::vector<perfdb::DeviceId>{{5}, {7}, {9}}));
  ScriptedComm other(1, {"", "", ""});
  EXPECT_TRUE(gather_messages(other, perfdb::DeviceId{7}, 0).empty());
  ScriptedComm broken(0, {"", encode_message(perfdb::DeviceId{7}), "5"});
  try {
    gather_messages(broken, perfdb::DeviceId{5}, 0);
    ADD_FAILURE() << "no error";
  } catch (const WireError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("perf DB device id from rank 2: field value", 0), 0u)
        << e.what();
  }

  // A receiver gets the root's split; the root keeps its own.
  ScriptedComm receiver(2, {encode_message(SplitShares{{8, 24, 0}}), "", ""});
  SplitShares shares;
  broadcast_message(receiver, shares, 0);
  EXPECT_EQ(shares.batch, (std::vector<int64_t>{8, 24, 0}));
  ScriptedComm sender(0, {"", "", ""});
  SplitShares mine{{4, 4}};
  broadcast_message(sender, mine, 0);
  EXPECT_EQ(mine.batch, (std::vector<int64_t>{4, 4}));
  ScriptedComm cut(1, {"4:1:8", "", ""});
  EXPECT_THROW(broadcast_message(cut, shares, 0), WireError);

  // Every rank's precision on every rank, in rank order.
  ScriptedComm precisions(0, {"", encode_message(common::Precision::kBf16),
                              encode_message(common::Precision::kFp16)});
  EXPECT_EQ(gather_precisions(precisions, common::Precision::kFp32),
            (std::vector<common::Precision>{common::Precision::kFp32, common::Precision::kBf16,
                                            common::Precision::kFp16}));

  // Every rank's text on every rank, whatever it holds.
  ScriptedComm texts(0, {"", "model: a\nsteps: 2\n", std::string("\0:|", 3)});
  EXPECT_EQ(all_gather_texts(texts, "mine"),
            (std::vector<std::string>{"mine", "model: a\nsteps: 2\n", std::string("\0:|", 3)}));
}

}  // namespace
}  // namespace vtrain::worker
