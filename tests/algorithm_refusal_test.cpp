// An algorithm the backend offers may still refuse a problem when it runs
// (cuDNN's heuristics list algorithms that then return NOT_SUPPORTED).
// Tuning (conv.algorithm: auto) and the profiler time algorithms through
// time_algorithms (worker/engine/kernel_timing.h), which leaves such an
// algorithm out instead of ending the job. The refusal is simulated here by
// a run that throws for one algorithm, on the CPU backend. Also how a
// named algorithm (conv.algorithm) is found among the candidates.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "worker/device/backend.h"
#include "worker/device/op_calls.h"
#include "worker/engine/kernel_timing.h"
#include "worker/engine/layers/conv_algorithm_choice.h"

namespace vtrain::worker {
namespace {

std::unique_ptr<Backend> cpu() {
  BackendOptions options;
  options.kind = worker::BackendKind::kCpu;
  options.threads = 1;
  return make_backend(options);
}

TEST(TimeAlgorithms, AnAlgorithmThatRefusesToRunComesBackWithoutATime) {
  auto backend = cpu();
  const std::vector<ConvAlgoInfo> algos = {{0, "a", 0}, {1, "b", 0}, {2, "c", 0}};
  std::vector<ConvAlgo> ran;
  const std::vector<AlgorithmTime> times =
      time_algorithms(*backend, algos, {0, 1, TimingStatistic::kMedian}, [&](ConvAlgo algo) {
        if (algo == 1) throw BackendError("b: CUDNN_STATUS_NOT_SUPPORTED");
        ran.push_back(algo);
      });
  ASSERT_EQ(times.size(), 3u);
  EXPECT_TRUE(times[0].time.has_value());
  EXPECT_FALSE(times[1].time.has_value());
  EXPECT_EQ(times[1].error, "b: CUDNN_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(times[2].time.has_value());
  EXPECT_EQ(ran, (std::vector<ConvAlgo>{0, 2}));
  EXPECT_EQ(refusals(times), std::vector<std::string>{"b (b: CUDNN_STATUS_NOT_SUPPORTED)"});

  // Anything but a backend's refusal is no refusal: it propagates.
  EXPECT_THROW(time_algorithms(*backend, algos, {0, 1, TimingStatistic::kMedian},
                               [](ConvAlgo) { throw std::logic_error("a bug"); }),
               std::logic_error);
}

ConvProblem small_problem() {
  ConvProblem p;
  p.x = {{2, 3, 8, 8}};
  p.k = 4;
  p.window = {3, 3, 1, 1, 1, 1};
  p.y = {p.output_shape()};
  return p;
}

TEST(ConvAlgorithmChoice, TuningLeavesOutAnAlgorithmThatRefusesToRun) {
  auto backend = cpu();
  ConvAlgorithmChoice choice(*backend, small_problem(), "auto", "conv1");
  const std::vector<std::pair<ConvAlgoInfo, double>> before =
      choice.timed_candidates(ConvKind::kForward);
  ASSERT_GE(before.size(), 2u) << "the CPU backend offers direct and im2col_gemm";
  const ConvAlgoInfo refusing = before.front().first;

  choice.tune(*backend, ConvKind::kForward, [&](ConvAlgo algo) {
    if (algo == refusing.algo) throw BackendError("refused at run time");
  });
  EXPECT_NE(choice.chosen(ConvKind::kForward).name, refusing.name);
  const auto after = choice.timed_candidates(ConvKind::kForward);
  EXPECT_EQ(after.size(), before.size() - 1);
  for (const auto& [a, seconds] : after) EXPECT_NE(a.name, refusing.name);
  ASSERT_EQ(choice.refused().size(), 1u);
  EXPECT_EQ(choice.refused()[0], "Forward " + refusing.name + " (refused at run time)");

  // When every candidate refuses, the layer cannot run: the error names it.
  ConvAlgorithmChoice none(*backend, small_problem(), "auto", "conv1");
  const std::string message = test_support::error_message<BackendError>([&] {
    none.tune(*backend, ConvKind::kBackwardData,
              [](ConvAlgo) { throw BackendError("refused at run time"); });
  });
  EXPECT_NE(message.find("layer 'conv1': no BackwardData algorithm ran"), std::string::npos)
      << message;
}

// conv.algorithm names an algorithm; where the problem's types offer it
// only in another form (winograd in bf16: winograd/pseudo_bf16, f32
// compute), that form is the one candidate; a name offered as it is wins.
TEST(ConvAlgorithmChoice, ANamedAlgorithmTakesTheFormTheProblemsTypesOffer) {
  auto backend = cpu();
  if (const auto why = backend->precision_unavailable(common::Precision::kBf16)) {
    GTEST_SKIP() << *why;
  }
  ConvProblem p = small_problem();
  p.x.shape.c = 16;
  p.k = 16;
  p.x.layout = backend->preferred_layout(16);
  p.y = {p.output_shape(), p.x.layout};
  const auto names = [&](ConvKind kind) {
    std::vector<std::string> out;
    for (const ConvAlgoInfo& a : conv_algorithms(*backend, kind, p, false)) out.push_back(a.name);
    return out;
  };
  ConvProblem bf16 = p;
  bf16.x.dtype = bf16.y.dtype = DataType::kBF16;
  for (ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData, ConvKind::kBackwardFilter}) {
    const std::vector<std::string> f32 = names(kind);
    if (std::find(f32.begin(), f32.end(), "winograd") == f32.end()) {
      GTEST_SKIP() << "oneDNN has no f32 winograd on this CPU";
    }
    const ConvAlgorithmChoice winograd(*backend, bf16, "winograd", "conv1");
    EXPECT_EQ(winograd.chosen(kind).name, "winograd/pseudo_bf16") << conv_kind_name(kind);
    EXPECT_EQ(winograd.timed_candidates(kind).size(), 1u) << conv_kind_name(kind);
    const ConvAlgorithmChoice direct(*backend, bf16, "direct", "conv1");
    EXPECT_EQ(direct.chosen(kind).name, "direct") << conv_kind_name(kind);
  }
}

}  // namespace
}  // namespace vtrain::worker
