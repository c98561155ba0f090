// The compute span (online re-balancing's per-rank compute time) on every
// backend: it covers the work issued between its ends and is done with it.
#include "tests/backend_conformance.h"

namespace vtrain::backend_test {
namespace {

struct SpanCase {
  const char* name;
  int64_t elements;  // of the tensor the span's work relus
  int repeats;
};

const SpanCase kSpanCases[] = {{"relu_1m_x20", 1 << 20, 20}};

class ComputeSpanConformance : public OnEveryBackend<SpanCase> {};

TEST_P(ComputeSpanConformance, EndWithoutBeginIsZero) {
  EXPECT_EQ(backend().end_compute_span_ms(), 0.0);
}

// The span's time is positive and finite, and once it is read the work in
// it is done: the result can be downloaded as it was computed.
TEST_P(ComputeSpanConformance, CoversTheWorkBetweenItsEnds) {
  Backend& b = backend();
  const TensorDesc d = desc({1, param().elements, 1, 1});
  const DeviceTensor x = filled(b, d, -1.0f), y = filled(b, d, 7.0f);
  b.synchronize(worker::StreamKind::kCompute);
  b.begin_compute_span();
  for (int i = 0; i < param().repeats; ++i) relu_forward(b, x.tensor, y.tensor);
  const double ms = b.end_compute_span_ms();
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(ms, 60e3);
  EXPECT_EQ(b.end_compute_span_ms(), 0.0) << "a span is read once";
  const Vec out = from_device(b, y.tensor);
  EXPECT_EQ(out.front(), 0.0f);
  EXPECT_EQ(out.back(), 0.0f);
}

VTRAIN_ON_EVERY_BACKEND(ComputeSpanConformance, kSpanCases);

}  // namespace
}  // namespace vtrain::backend_test
