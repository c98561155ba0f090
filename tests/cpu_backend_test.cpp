// The CPU backend's own behaviour, through the Backend interface only: which
// convolution algorithms it lists and their workspaces, its layouts and the
// errors for layouts an op does not take, transfers and the memory stream,
// memory accounting and limits, and the factory. The numbers every op
// computes are checked on every backend by backend_conformance_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tests/backend_test_support.h"
#include "tests/test_support.h"
#include "worker/device/backend.h"

namespace vtrain::worker {
namespace {

using namespace vtrain::backend_test;  // NOLINT: the shared test helpers

// The backend most tests share: creating one per test would only add oneDNN
// start-up time. Tests that need options of their own make their own.
Backend& cpu() {
  static const std::unique_ptr<Backend> backend = make_backend({.kind = worker::BackendKind::kCpu});
  return *backend;
}

class PinnedBuffer {
 public:
  PinnedBuffer(Backend& backend, size_t bytes)
      : backend_(&backend), ptr_(backend.allocate_pinned(bytes)) {}
  ~PinnedBuffer() { backend_->free_pinned(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* get() const { return ptr_; }

 private:
  Backend* backend_;
  void* ptr_;
};

// ============================================================== convolution

std::vector<std::string> algorithm_names(const std::vector<ConvAlgoInfo>& algos) {
  std::vector<std::string> names;
  for (const ConvAlgoInfo& a : algos) names.push_back(a.name);
  return names;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return "{" + s + "}";
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

struct ListingCase {
  ConvCase conv;
  bool expect_winograd;  // 3x3, stride 1, channels multiples of 16
};

const ListingCase kListingCases[] = {
    {{"lenet1_n1", 1, 28, 28, 20, 5, 0, 1, 1}, false},
    {{"lenet1_n4", 1, 28, 28, 20, 5, 0, 1, 4}, false},
    {{"lenet2_n1", 20, 12, 12, 50, 5, 0, 1, 1}, false},
    {{"lenet2_n4", 20, 12, 12, 50, 5, 0, 1, 4}, false},
    {{"c16k32_3x3_pad1_n1", 16, 14, 14, 32, 3, 1, 1, 1}, true},
    {{"c16k32_3x3_pad1_n4", 16, 14, 14, 32, 3, 1, 1, 4}, true},
    {{"c3k8_3x3_stride2_n1", 3, 15, 15, 8, 3, 1, 2, 1}, false},
    {{"c3k8_3x3_stride2_n4", 3, 15, 15, 8, 3, 1, 2, 4}, false},
};

// direct and im2col_gemm for every problem and kind, in every pair of plain
// and preferred layouts, with and without accumulation; winograd where
// oneDNN has it. (What each computes is checked in
// backend_conformance_test.)
TEST(CpuBackend, ListsDirectIm2colAndWinogradWhereItApplies) {
  for (const ListingCase& lc : kListingCases) {
    for (const auto& [x_layout, y_layout] : conv_layouts(cpu(), lc.conv)) {
      const ConvProblem p = conv_problem(lc.conv, x_layout, y_layout);
      SCOPED_TRACE(p.str());
      for (ConvKind kind : kConvKinds) {
        for (bool accumulate : {false, true}) {
          const std::vector<std::string> names =
              algorithm_names(conv_algorithms(cpu(), kind, p, accumulate));
          EXPECT_TRUE(contains(names, "direct"))
              << conv_kind_name(kind) << " lists " << joined(names) << ", no \"direct\"";
          EXPECT_TRUE(contains(names, "im2col_gemm"))
              << conv_kind_name(kind) << " lists " << joined(names) << ", no \"im2col_gemm\"";
          // oneDNN has f32 winograd on AVX-512 only, where the backend blocks
          // channels by 16.
          if (lc.expect_winograd && cpu().preferred_layout(16) == Layout::kBlocked16) {
            EXPECT_TRUE(contains(names, "winograd"))
                << conv_kind_name(kind) << " lists " << joined(names)
                << ": expected \"winograd\" for a 3x3 stride-1 problem with 16-multiple channels";
          }
        }
      }
    }
  }
}

// bf16 problems also list the f32-compute variants (mu-cuDNN's precision
// substitution): direct/pseudo_bf16 always, winograd/pseudo_bf16 where the
// f32 problem lists winograd; f32 problems list neither. On integer data
// every sum is exact in f32, so each kind's outputs are the exact results
// rounded once to the tensor's type (dw and dbias f32, exact), also when
// summing into previous contents (beta 1), with a bias in forward: the
// conversions into and out of the f32 primitive, the bias's included.
TEST(CpuBackend, Bf16ProblemsAlsoComputeInF32) {
  if (const auto why = cpu().precision_unavailable(common::Precision::kBf16)) {
    GTEST_SKIP() << *why;
  }
  const std::string direct = "direct" + std::string(kPseudoBf16AlgorithmSuffix);
  const std::string winograd = "winograd" + std::string(kPseudoBf16AlgorithmSuffix);
  const ConvCase cc = kListingCases[5].conv;  // 16 -> 32 channels, 3x3, pad 1, batch 4
  std::mt19937 rng(3);
  const auto integers = [&](size_t count, int most) {
    std::uniform_int_distribution<int> dist(-most, most);
    Vec v(count);
    for (float& x : v) x = static_cast<float>(dist(rng));
    return v;
  };
  for (const auto& [x_layout, y_layout] : conv_layouts(cpu(), cc)) {
    const ConvProblem f32 = conv_problem(cc, x_layout, y_layout);
    const ConvProblem p = conv_problem(cc, x_layout, y_layout, DataType::kBF16);
    SCOPED_TRACE(p.str());
    ConvData d(p);
    d.x = integers(d.x.size(), 3);
    d.w = integers(d.w.size(), 3);
    d.bias = integers(d.bias.size(), 8);
    d.dy = integers(d.dy.size(), 3);
    // The exact results (integers well inside f32's 24 bits), not rounded.
    d.y_ref = reference::conv_forward(p, d.x, d.w, d.bias);
    d.dx_ref = reference::conv_backward_data(p, d.dy, d.w);
    d.dw_ref = reference::conv_backward_filter(p, d.x, d.dy, &d.dbias_ref);
    for (ConvKind kind : kConvKinds) {
      const std::vector<std::string> f32_names =
          algorithm_names(conv_algorithms(cpu(), kind, f32, false));
      EXPECT_FALSE(contains(f32_names, direct) || contains(f32_names, winograd))
          << conv_kind_name(kind) << ": f32 lists " << joined(f32_names);
      const std::vector<ConvAlgoInfo> algos = conv_algorithms(cpu(), kind, p, false);
      const std::vector<std::string> names = algorithm_names(algos);
      EXPECT_TRUE(contains(names, direct)) << conv_kind_name(kind) << " lists " << joined(names);
      EXPECT_EQ(contains(names, winograd), contains(f32_names, "winograd"))
          << conv_kind_name(kind) << ": bf16 lists " << joined(names) << ", f32 "
          << joined(f32_names);
      for (const ConvAlgoInfo& info : algos) {
        if (info.name != direct) continue;
        const DataType out_type = kind == ConvKind::kBackwardFilter ? DataType::kF32 : p.x.dtype;
        std::vector<Vec> previous;
        for (const Vec& r : d.reference_of(kind)) previous.push_back(integers(r.size(), 8));
        for (const float beta : {0.0f, 1.0f}) {
          const ConvAlgoInfo sized{info.algo, info.name,
                                   conv_workspace(cpu(), kind, info.algo, p, beta != 0.0f)};
          const std::vector<Vec> got = run_conv(cpu(), kind, sized, p, d, beta, previous);
          const std::vector<Vec> reference = d.reference_of(kind);
          for (size_t i = 0; i < got.size(); ++i) {
            const Vec expected = reference::rounded(
                out_type, beta == 0.0f ? reference[i] : plus(reference[i], previous[i]));
            expect_equal(got[i], expected,
                         std::string(conv_kind_name(kind)) + " beta " + std::to_string(int(beta)) +
                             " output " + std::to_string(i));
          }
        }
      }
    }
  }
}

// `auto` takes the CPU where no GPU is visible, on any build and machine: the
// GPUs are hidden before CUDA is first touched (ctest runs every test in a
// process of its own). Asking for cuda then says why it cannot be had.
TEST(BackendFactory, AutoTakesTheCpuWhereNoGpuIsVisible) {
  ASSERT_EQ(setenv("CUDA_VISIBLE_DEVICES", "", 1), 0);
  EXPECT_FALSE(gpu_available());
  EXPECT_EQ(make_backend({.kind = worker::BackendKind::kAuto, .threads = 1})->device_info().backend,
            "cpu");
  std::string why;
  try {
    make_backend({.kind = worker::BackendKind::kCuda, .threads = 1});
  } catch (const BackendError& e) {
    why = e.what();
  }
  EXPECT_NE(why.find("backend 'cuda'"), std::string::npos) << why;
  EXPECT_NE(why.find(" cpu"), std::string::npos) << why;
}

// im2col + GEMM lowers the whole batch at once: its workspace is the
// algorithm's memory/time trade-off and must grow with the batch.
TEST(CpuBackend, Im2colWorkspaceGrowsWithBatch) {
  const ConvProblem p1 = conv_problem({"lenet2", 20, 12, 12, 50, 5, 0, 1, 1});
  const ConvProblem p8 = p1.with_batch(8);
  for (ConvKind kind : kConvKinds) {
    std::optional<size_t> ws1, ws8;
    for (const ConvAlgoInfo& info : conv_algorithms(cpu(), kind, p1, false))
      if (info.name == "im2col_gemm") ws1 = info.workspace_bytes;
    for (const ConvAlgoInfo& info : conv_algorithms(cpu(), kind, p8, false))
      if (info.name == "im2col_gemm") ws8 = info.workspace_bytes;
    ASSERT_TRUE(ws1 && ws8) << conv_kind_name(kind) << ": im2col_gemm not listed";
    EXPECT_GT(*ws8, *ws1) << conv_kind_name(kind) << ": n=1 " << *ws1 << " B, n=8 " << *ws8 << " B";
  }
}

TEST(CpuBackend, WorkspaceOfUnsupportedAlgorithmThrows) {
  // Find winograd's id on a problem it supports, then ask for a stride-2 one.
  const ConvProblem supported = conv_problem(kListingCases[4].conv);
  const ConvProblem strided = conv_problem(kListingCases[6].conv);
  for (const ConvAlgoInfo& info : conv_algorithms(cpu(), ConvKind::kForward, supported, false)) {
    if (info.name != "winograd") continue;
    EXPECT_THROW(conv_workspace(cpu(), ConvKind::kForward, info.algo, strided, false), BackendError);
    return;
  }
  GTEST_SKIP() << "winograd not listed on this CPU; nothing unsupported to ask for";
}

// ============================================ layouts an op does not take

// The contract lets every activation take any layout, the {n, out, 1, 1}
// output of an inner product included.
TEST(CpuBackend, InnerProductOutputMustBePlain) {
  // backend.h: inner-product outputs are kPlain {n, out, 1, 1}; anything
  // else is a clear error rather than a silent reorder.
  const Layout y_layout = cpu().preferred_layout(120);
  if (y_layout == Layout::kPlain) GTEST_SKIP() << "plain is preferred for 120 channels";
  const DeviceTensor xt(cpu(), desc({4, 50, 4, 4}, cpu().preferred_layout(50)));
  const DeviceBuffer wd = to_device(cpu(), Vec(static_cast<size_t>(120 * 50 * 16), 0.0f));
  DeviceTensor yt(cpu(), desc({4, 120, 1, 1}, y_layout));
  try {
    inner_product_forward(cpu(), xt.tensor, wd.floats(), nullptr, yt.tensor);
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("must be plain"), std::string::npos) << e.what();
  }
}

// The contract lets every activation take any layout, logits included.
TEST(CpuBackend, SoftmaxCrossEntropyLogitsMustBePlain) {
  const Layout layout = cpu().preferred_layout(10);
  if (layout == Layout::kPlain) GTEST_SKIP() << "plain is preferred for 10 channels";
  DeviceTensor logits(cpu(), desc({2, 10, 1, 1}, layout));
  DeviceBuffer labels(cpu(), 2 * sizeof(int32_t));
  EXPECT_THROW(softmax_cross_entropy(cpu(), logits.tensor, static_cast<const int32_t*>(labels.get()),
                                           1.0f, nullptr),
               BackendError);
}

// The tensors of one element-wise call share one descriptor: a mismatch is
// named, type by type, shape by shape, layout by layout.
TEST(CpuBackend, MismatchedDescriptorsAreNamed) {
  const DeviceTensor x(cpu(), desc({2, 16, 4, 4}, Layout::kPlain, DataType::kBF16));
  const DeviceTensor y(cpu(), desc({2, 16, 4, 4}));
  EXPECT_EQ(test_support::error_message<BackendError>(
                [&] { relu_forward(cpu(), x.tensor, y.tensor); }),
            "cpu backend: relu_forward: x is bf16, y is f32");
  const DeviceTensor dx(cpu(), desc({2, 16, 4, 5}, Layout::kBlocked8));
  EXPECT_EQ(test_support::error_message<BackendError>(
                [&] { relu_backward(cpu(), y.tensor, y.tensor, dx.tensor); }),
            "cpu backend: relu_backward: y is 2x16x4x4, dx is 2x16x4x5; y is plain, dx is nChw8c");
}

// ============================================== layouts, fill, transfers

TEST(CpuBackend, ConvertRoundTripsThroughEveryLayout) {
  std::mt19937 rng(22);
  const Shape s{2, 20, 5, 5};
  const Vec x = random_vec(rng, s.elements());
  const DeviceTensor plain = to_device(cpu(), x, desc(s));
  DeviceTensor b8(cpu(), desc(s, Layout::kBlocked8));
  DeviceTensor b16(cpu(), desc(s, Layout::kBlocked16));
  DeviceTensor back(cpu(), desc(s));
  cpu().convert(plain.tensor, b8.tensor);
  expect_equal(from_device(cpu(), b8.tensor), x, "plain -> nChw8c");
  cpu().convert(b8.tensor, b16.tensor);
  expect_equal(from_device(cpu(), b16.tensor), x, "nChw8c -> nChw16c");
  DeviceTensor nhwc(cpu(), desc(s, Layout::kNhwc));
  cpu().convert(b16.tensor, nhwc.tensor);
  expect_equal(from_device(cpu(), nhwc.tensor), x, "nChw16c -> nhwc");
  cpu().convert(nhwc.tensor, back.tensor);
  expect_equal(from_device(cpu(), back.tensor), x, "nhwc -> plain");
}

TEST(CpuBackend, FillSetsEveryLogicalElement) {
  const Shape s{3, 20, 4, 4};
  for (Layout layout : {Layout::kPlain, Layout::kBlocked8, Layout::kBlocked16, Layout::kNhwc}) {
    DeviceTensor t(cpu(), desc(s, layout));
    cpu().fill(t.tensor, 3.5f);
    expect_equal(from_device(cpu(), t.tensor), Vec(static_cast<size_t>(s.elements()), 3.5f),
                 std::string("fill ") + layout_name(layout));
  }
}

TEST(CpuBackend, MemoryStreamCopiesThroughPinnedMemory) {
  std::mt19937 rng(23);
  const int64_t count = 1 << 20;  // 4 MiB: big enough that the copy takes a while
  const size_t bytes = count * sizeof(float);
  const Vec x = random_vec(rng, count);
  const DeviceBuffer source = to_device(cpu(), x);
  DeviceBuffer restored(cpu(), bytes);
  PinnedBuffer pinned(cpu(), bytes);

  cpu().copy_async(pinned.get(), source.get(), bytes, StreamKind::kMemory);
  const Event offloaded = cpu().record_event(StreamKind::kMemory);
  EXPECT_EQ(offloaded.stream, StreamKind::kMemory);
  cpu().synchronize(offloaded);
  // Pinned memory is host memory: readable directly once the event has passed.
  EXPECT_EQ(std::memcmp(pinned.get(), x.data(), bytes), 0) << "device -> pinned copy differs";

  cpu().copy_async(restored.get(), pinned.get(), bytes, StreamKind::kMemory);
  const Event prefetched = cpu().record_event(StreamKind::kMemory);
  // Compute work issued after this waits for the prefetch.
  cpu().wait_event(StreamKind::kCompute, prefetched);
  cpu().synchronize(StreamKind::kMemory);
  expect_equal(from_device(cpu(), restored.floats(), count), x, "device -> pinned -> device");

  // Events are ordered: a later ticket on the same stream is not earlier.
  const Event later = cpu().record_event(StreamKind::kMemory);
  EXPECT_GE(later.ticket, prefetched.ticket);
  cpu().synchronize(later);
}

// The tests' lazy memory stream (BackendOptions::lazy_memory_stream): a
// copy happens only once something waits for it, and then every copy
// before it too, in order; one nobody waits for happens by the backend's
// end at the latest.
TEST(CpuBackend, LazyMemoryStreamCopiesOnlyWhenWaitedFor) {
  const std::unique_ptr<Backend> b =
      make_backend({.kind = worker::BackendKind::kCpu, .lazy_memory_stream = true});
  float src[3] = {1, 2, 3}, dst[3] = {0, 0, 0};
  b->copy_async(&dst[0], &src[0], sizeof(float), StreamKind::kMemory);
  const Event first = b->record_event(StreamKind::kMemory);
  b->copy_async(&dst[1], &src[1], sizeof(float), StreamKind::kMemory);
  const Event second = b->record_event(StreamKind::kMemory);
  b->copy_async(&dst[2], &src[2], sizeof(float), StreamKind::kMemory);
  EXPECT_EQ(dst[0], 0.0f);  // not waited for: not copied
  b->synchronize(first);
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_EQ(dst[1], 0.0f);
  b->wait_event(StreamKind::kCompute, second);  // compute runs on this thread: the host waits
  EXPECT_EQ(dst[1], 2.0f);
  EXPECT_EQ(dst[2], 0.0f);
  b->synchronize(StreamKind::kMemory);
  EXPECT_EQ(dst[2], 3.0f);
}

// free_pinned waits for the copies queued before it, which may still read
// the memory: on the lazy stream, the copy has happened once it returns.
TEST(CpuBackend, FreePinnedWaitsForTheCopiesQueuedBefore) {
  const std::unique_ptr<Backend> b =
      make_backend({.kind = worker::BackendKind::kCpu, .lazy_memory_stream = true});
  auto* pinned = static_cast<float*>(b->allocate_pinned(3 * sizeof(float)));
  std::fill(pinned, pinned + 3, 7.0f);
  float dst[3] = {0, 0, 0};
  b->copy_async(dst, pinned, sizeof(dst), StreamKind::kMemory);
  EXPECT_EQ(dst[0], 0.0f);  // not waited for: not copied
  b->free_pinned(pinned);
  EXPECT_EQ(dst[0], 7.0f);
  EXPECT_EQ(dst[2], 7.0f);
}

// ============================================== memory accounting, misc

TEST(CpuBackendMemory, AccountingPeakAndLimit) {
  const size_t kib = 1024;
  const std::unique_ptr<Backend> b =
      make_backend({.kind = worker::BackendKind::kCpu, .memory_limit = 1024 * kib});
  EXPECT_EQ(b->device_info().memory_bytes, 1024 * kib);
  EXPECT_EQ(b->device_bytes_in_use(), 0u);

  void* first = b->allocate_device(256 * kib);
  void* second = b->allocate_device(512 * kib);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u) << "not 64-byte aligned";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(second) % 64, 0u) << "not 64-byte aligned";
  EXPECT_EQ(b->device_bytes_in_use(), 768 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 768 * kib);

  b->free_device(first);
  EXPECT_EQ(b->device_bytes_in_use(), 512 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 768 * kib);
  b->reset_peak();
  EXPECT_EQ(b->device_bytes_peak(), 512 * kib);

  // 512 KiB in use + 600 KiB > 1 MiB; a failed request changes nothing.
  EXPECT_THROW(b->allocate_device(600 * kib), BackendError);
  EXPECT_THROW(b->allocate_device(2048 * kib), BackendError);
  EXPECT_EQ(b->device_bytes_in_use(), 512 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 512 * kib);

  // Exactly up to the limit is allowed.
  void* rest = b->allocate_device(512 * kib);
  EXPECT_EQ(b->device_bytes_in_use(), 1024 * kib);
  EXPECT_EQ(b->device_bytes_peak(), 1024 * kib);
  b->free_device(rest);
  b->free_device(second);
  EXPECT_EQ(b->device_bytes_in_use(), 0u);
  EXPECT_EQ(b->device_bytes_peak(), 1024 * kib);
}

TEST(CpuBackendMisc, DeviceInfoDescribesTheCpuBackend) {
  const DeviceInfo info = cpu().device_info();
  EXPECT_EQ(info.backend, "cpu");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.threads, 1);
  EXPECT_NE(info.library_version.find("oneDNN"), std::string::npos) << info.library_version;
  EXPECT_GT(info.memory_bytes, 0u);
}

// A kind is an enum (kBackendKindNames); a name read from a DeviceInfo
// or the perf DB that is none of them is refused naming the known ones.
TEST(CpuBackendMisc, UnknownKindThrowsNamingTheKnownOnes) {
  try {
    parse_backend_kind("tpu");
    FAIL() << "parse_backend_kind accepted kind \"tpu\"";
  } catch (const BackendError& e) {
    EXPECT_STREQ(e.what(), "unknown backend kind 'tpu' (known: auto, cpu, cuda)");
  }
  EXPECT_EQ(parse_backend_kind("cuda"), BackendKind::kCuda);
  EXPECT_EQ(parse_backend_kind(cpu().device_info().backend), BackendKind::kCpu);
}

// An id no convolution algorithm has is refused naming every id the
// backend knows, from the same table that names them.
TEST(CpuBackendMisc, UnknownAlgorithmIdThrowsNamingTheKnownOnes) {
  try {
    cpu().conv_algorithm_name(ConvKind::kForward, 99);
    FAIL() << "conv_algorithm_name accepted id 99";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "id 99 (known: 0 direct, 1 winograd, 2 im2col_gemm, 3 direct/pseudo_bf16, "
                  "4 winograd/pseudo_bf16)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace vtrain::worker
