// The cuDNN graph-API path of the CUDA backend (conv.cudnn_graph,
// worker/device/cuda/cuda_conv_graph.h) planned host-side, without a GPU:
// cuDNN 9.8 and newer take a device's properties in place of a handle, so
// these tests rank and rebuild engine configurations for an NVIDIA H100 on
// any machine with the CUDA toolkit (CUDA builds only). What they cannot
// check is running a plan: CudaBackendTest.GraphEngines... does that where
// a GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/backend_test_support.h"
#include "worker/device/backend.h"
#include "worker/device/cuda/cuda_conv_graph.h"

namespace vtrain::worker::cuda {
namespace {

using backend_test::ConvCase;

// An H100 80GB HBM3 as cuDNN describes a device (its JSON representation).
constexpr const char* kH100 =
    R"({"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],)"
    R"("regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,)"
    R"("maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,)"
    R"("reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,"maxCtasPerSM":32,)"
    R"("maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,)"
    R"("supportCoopLaunch":1,"totalGlobalMem":84929216512,"smClockRateKHz":1980000,)"
    R"("memClockRateKHz":2619000,"l2CacheSize":52428800,"cudaDeviceId":0,"deviceVer":900,)"
    R"("driverVer":12080,"deviceName":"NVIDIA H100 80GB HBM3"})";

class CudaGraphPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cudnnGetVersion() < 90800) {
      GTEST_SKIP() << "cuDNN " << cudnnGetVersion() << " plans only for a visible GPU (9.8+ "
                   << "takes a device's properties)";
    }
    cudnnBackendDescriptor_t raw = nullptr;
    ASSERT_EQ(cudnnBackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &raw),
              CUDNN_STATUS_SUCCESS);
    device_.reset(raw);
    const cudnnStatus_t set = cudnnBackendSetAttribute(
        raw, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
        static_cast<int64_t>(std::strlen(kH100) + 1), kH100);
    const cudnnStatus_t done = set == CUDNN_STATUS_SUCCESS ? cudnnBackendFinalize(raw) : set;
    if (done != CUDNN_STATUS_SUCCESS) {
      GTEST_SKIP() << "this cuDNN takes no H100 description: " << cudnnGetErrorString(done);
    }
  }
  GraphTarget target() const { return {.device = device_.get()}; }

  BackendDescriptor device_;
};

// Every half configuration, layout and kind of a ResNet 3x3 convolution,
// a strided 1x1 one and one of VGG-16's at batch 64 gets engine
// configurations from the heuristics, named "eng<index>[_k<knob>=<value>...]"
// and the configuration's suffix;
// each of the first four rebuilt from its name's parts finalizes a plan
// for beta 0 and (but for the weight gradient, always staged) beta 1.
TEST_F(CudaGraphPlanTest, RanksAndRebuildsEngineConfigurationsForAnH100WithoutAGpu) {
  const ConvCase cases[] = {{"resnet_3x3", 64, 28, 28, 64, 3, 1, 1, 8},
                            {"downsample_1x1", 64, 28, 28, 128, 1, 0, 2, 8},
                            {"vgg16_conv3", 256, 56, 56, 256, 3, 1, 1, 64}};
  int plans = 0;
  for (const ConvVariantInfo& variant : kConvVariants) {
    if (variant.tensors == DataType::kF32) continue;
    for (const Layout layout : {Layout::kPlain, Layout::kNhwc}) {
      for (const ConvCase& cc : cases) {
        const ConvProblem p = backend_test::conv_problem(cc, layout, layout, variant.tensors);
        for (const ConvKind kind : {ConvKind::kForward, ConvKind::kBackwardData,
                                    ConvKind::kBackwardFilter}) {
          const std::string what = std::string(conv_kind_name(kind)) + " " + p.str() +
                                   variant.suffix;
          SCOPED_TRACE(what);
          const std::vector<GraphEngine> engines =
              ranked_graph_engines(target(), kind, p, variant);
          ASSERT_FALSE(engines.empty());
          int finalized = 0;
          for (size_t i = 0; i < engines.size() && i < 4; ++i) {
            const GraphEngine& e = engines[i];
            EXPECT_EQ(e.kind, kind);
            EXPECT_EQ(e.variant, &variant);
            EXPECT_TRUE(e.name.starts_with("eng" + std::to_string(e.global_index))) << e.name;
            EXPECT_TRUE(e.name.ends_with(variant.suffix)) << e.name;
            EXPECT_TRUE(is_graph_engine(e.name)) << e.name;
            EXPECT_TRUE(conv_algorithm_allowed(e.name, variant.tensors == DataType::kBF16
                                                           ? common::Precision::kBf16
                                                           : common::Precision::kFp16,
                                               true))
                << e.name;
            const GraphPlan zero = graph_plan_for(target(), kind, p, e, 0.0f);
            EXPECT_TRUE(zero.plan) << e.name << ": " << zero.refused;
            if (kind != ConvKind::kBackwardFilter) {
              const GraphPlan one = graph_plan_for(target(), kind, p, e, 1.0f);
              EXPECT_TRUE(one.plan) << e.name << " beta 1: " << one.refused;
            }
            finalized += zero.plan ? 1 : 0;
          }
          EXPECT_GT(finalized, 0);
          plans += finalized;
        }
      }
    }
  }
  EXPECT_GT(plans, 0);
}

// A plan records the activations' alignment it was made for: whole
// samples of the problem's bytes (16 for these channels, 2 for an odd
// count of half channels and pixels).
TEST_F(CudaGraphPlanTest, PlansAssumeTheAlignmentOfWholeSamples) {
  const ConvVariantInfo* bf16 = nullptr;
  for (const ConvVariantInfo& v : kConvVariants) {
    if (v.tensors == DataType::kBF16) bf16 = &v;
  }
  ASSERT_NE(bf16, nullptr);
  const ConvProblem even =
      backend_test::conv_problem({"even", 64, 8, 8, 64, 3, 1, 1, 4}, Layout::kNhwc, Layout::kNhwc,
                                 DataType::kBF16);
  const ConvProblem odd =
      backend_test::conv_problem({"odd", 3, 7, 7, 5, 3, 1, 1, 4}, Layout::kPlain, Layout::kPlain,
                                 DataType::kBF16);
  const std::pair<ConvProblem, int64_t> expected[] = {{even, 16}, {odd, 2}};
  int planned = 0;
  for (const auto& [p, alignment] : expected) {
    const std::vector<GraphEngine> engines =
        ranked_graph_engines(target(), ConvKind::kForward, p, *bf16);
    if (engines.empty()) continue;  // no engine for a shape this odd is cuDNN's say
    const GraphPlan plan = graph_plan_for(target(), ConvKind::kForward, p, engines.front(), 0.0f);
    EXPECT_EQ(plan.alignment, alignment) << p.str();
    ++planned;
  }
  EXPECT_GT(planned, 0);
}

}  // namespace
}  // namespace vtrain::worker::cuda
