// Host conversions of a step's input batch to half precision, as the CUDA
// backend's upload runs them: half.h's scalar loop against
// common/half_convert.h's vector path, alternating, medians and ratios.
//
//   bench_half_convert [--elements N] [--rounds R]
//   (default N = 9,633,792: ResNet-50's batch of 64 at 3x224x224)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "common/half_convert.h"

using namespace vtrain;
using common::ConvertPath;

int main(int argc, char** argv) {
  size_t elements = size_t{64} * 3 * 224 * 224;
  int rounds = 9;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--elements" || a == "--rounds") && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v <= 0) {
        std::fprintf(stderr, "bench_half_convert: %s takes a positive integer, got '%s'\n",
                     a.c_str(), argv[i]);
        return 2;
      }
      if (a == "--elements") {
        elements = static_cast<size_t>(v);
      } else {
        rounds = static_cast<int>(v);
      }
    } else {
      std::fprintf(stderr, "usage: bench_half_convert [--elements N] [--rounds R]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::vector<float> x(elements);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);  // a normalised image's values
  for (float& v : x) v = normal(rng);
  std::vector<common::F16> f16(elements);
  std::vector<common::Bf16> bf16(elements);
  std::vector<float> back(elements);

  std::printf("%zu elements (%.1f MB of float), vector path: %s; medians of %d alternating "
              "rounds\n",
              elements, elements * 4 / 1e6, common::vector_conversions(), rounds);
  std::printf("%-22s %10s %10s %8s\n", "conversion", "scalar ms", "vector ms", "ratio");
  const auto row = [&](const char* what, auto&& run) {
    std::vector<double> scalar, vector;
    for (int r = 0; r < rounds; ++r) {
      scalar.push_back(bench::median_ms(1, [&] { run(ConvertPath::kScalar); }));
      vector.push_back(bench::median_ms(1, [&] { run(ConvertPath::kVector); }));
    }
    std::sort(scalar.begin(), scalar.end());
    std::sort(vector.begin(), vector.end());
    const double s = scalar[scalar.size() / 2], v = vector[vector.size() / 2];
    std::printf("%-22s %10.2f %10.2f %7.2fx\n", what, s, v, s / v);
  };
  row("float -> f16", [&](ConvertPath p) { common::to_f16(x, f16.data(), p); });
  row("float -> bf16", [&](ConvertPath p) { common::to_bf16(x, bf16.data(), p); });
  row("f16 -> float", [&](ConvertPath p) { common::to_float(f16, back.data(), p); });
  row("bf16 -> float", [&](ConvertPath p) { common::to_float(bf16, back.data(), p); });
  return 0;
}
