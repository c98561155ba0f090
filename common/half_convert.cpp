#include "common/half_convert.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace vtrain::common {
namespace {

template <typename In, typename Out, typename F>
void scalar(std::span<const In> in, Out* out, F convert) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = convert(in[i]);
}

#if defined(__x86_64__)
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// Rounding to nearest even is the instruction's immediate, not MXCSR's mode.
__attribute__((target("avx,f16c"))) void f16_f16c(std::span<const float> in, F16* out) {
  size_t i = 0;
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in.data() + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < in.size(); ++i) out[i] = to_f16(in[i]);
}

__attribute__((target("avx,f16c"))) void float_f16c(std::span<const F16> in, float* out) {
  size_t i = 0;
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.data() + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < in.size(); ++i) out[i] = to_float(in[i]);
}

// half.h's to_bf16 on 8 floats' bits, each result in the low 16 bits of its lane.
__attribute__((target("avx2"))) inline __m256i bf16_bits(__m256i u) {
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i rounding =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, rounding), 16);
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(high, _mm256_set1_epi32(0x40)), nan);
}

__attribute__((target("avx2"))) void bf16_avx2(std::span<const float> in, Bf16* out) {
  size_t i = 0;
  for (; i + 16 <= in.size(); i += 16) {
    const auto* p = reinterpret_cast<const __m256i*>(in.data() + i);
    // packus interleaves the 128-bit lanes (a0-3 b0-3 a4-7 b4-7): put them back.
    const __m256i packed = _mm256_packus_epi32(bf16_bits(_mm256_loadu_si256(p)),
                                               bf16_bits(_mm256_loadu_si256(p + 1)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
  for (; i < in.size(); ++i) out[i] = to_bf16(in[i]);
}

__attribute__((target("avx2"))) void float_bf16_avx2(std::span<const Bf16> in, float* out) {
  size_t i = 0;
  for (; i + 8 <= in.size(); i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in.data() + i));
    const __m256i bits = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bits);
  }
  for (; i < in.size(); ++i) out[i] = to_float(in[i]);
}
#else
bool has_f16c() { return false; }
bool has_avx2() { return false; }
void f16_f16c(std::span<const float>, F16*) {}
void float_f16c(std::span<const F16>, float*) {}
void bf16_avx2(std::span<const float>, Bf16*) {}
void float_bf16_avx2(std::span<const Bf16>, float*) {}
#endif

}  // namespace

void to_f16(std::span<const float> in, F16* out, ConvertPath path) {
  if (path == ConvertPath::kVector && has_f16c()) return f16_f16c(in, out);
  scalar(in, out, [](float f) { return to_f16(f); });
}

void to_bf16(std::span<const float> in, Bf16* out, ConvertPath path) {
  if (path == ConvertPath::kVector && has_avx2()) return bf16_avx2(in, out);
  scalar(in, out, [](float f) { return to_bf16(f); });
}

void to_float(std::span<const F16> in, float* out, ConvertPath path) {
  if (path == ConvertPath::kVector && has_f16c()) return float_f16c(in, out);
  scalar(in, out, [](F16 h) { return to_float(h); });
}

void to_float(std::span<const Bf16> in, float* out, ConvertPath path) {
  if (path == ConvertPath::kVector && has_avx2()) return float_bf16_avx2(in, out);
  scalar(in, out, [](Bf16 h) { return to_float(h); });
}

const char* vector_conversions() {
  if (has_f16c()) return has_avx2() ? "f16 F16C, bf16 AVX2" : "f16 F16C, bf16 scalar";
  return has_avx2() ? "f16 scalar, bf16 AVX2" : "scalar";
}

}  // namespace vtrain::common
