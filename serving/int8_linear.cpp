// A linear layer multiplying in int8, in one call: its input quantized per row, the int8
// product (torch's _int_mm), and the int32 sums turned into the layer's output in place.
//
// The same numbers, bit for bit, as these torch operations (int8_linear.py's
// int8_linear_torch), each of which reads and writes a whole tensor:
//   r = x.abs().amax(1, keepdim=True).div(127).clamp(min=TINY)
//   p = torch.round(x / r).to(torch.int8)
//   y = torch.addcmul(bias, torch._int_mm(p, weight_t).to(torch.float32) * r, scale)
// Here each row of x is read twice while in cache, and the int32 sums, written into y's own
// memory, are turned into y there in one pass. torch's addcmul is bias + y * scale in one
// rounding (its build contracts it to a fused multiply-add): so is this, explicitly, as the
// kernel is compiled with -ffp-contract=off.
//
// Also int8_few_rows: the same numbers for a few rows (a sentence's beam), with the sums made
// here (with VNNI's int8 dot products where the CPU has them); int8_rows_by_sentence:
// vocabulary selection's rows of W_o that are each sentence's own,
// in int8, times that sentence's hypotheses; and the CPU kernel of torch.ops.convs2s.int8_linear,
// the operation an exported int8 program calls (below).
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
using IntVec = at::vec::Vectorized<int32_t>;
static_assert(Vec::size() == IntVec::size(), "a vector of int32 sums converts to one of floats");

// p (rows x n, int8) and r (rows) with x ~ r p, each row scaled by its own largest |x|.
void quantize_rows(const float* x, int64_t rows, int64_t n, int8_t* p, float* r) {
  const float tiny = std::numeric_limits<float>::min();
  at::parallel_for(0, rows, 0, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* row = x + m * n;
      int8_t* q = p + m * n;
      const float largest = at::vec::map_reduce_all<float>(
          [](Vec v) { return v.abs(); }, [](Vec a, Vec b) { return at::vec::maximum(a, b); }, row, n);
      float scale = largest / 127.0f;
      scale = scale < tiny ? tiny : scale;  // clamp_(min=TINY), NaN kept as torch keeps it
      r[m] = scale;
      int64_t j = 0;
      for (; j + Vec::size() <= n; j += Vec::size()) {
        // integers within +-127, as floats, then narrowed to int8 a vector at a time (the
        // conversion truncates and saturates, which leaves such integers as they are)
        at::vec::convert<int8_t>((Vec::loadu(row + j) / Vec(scale)).round()).store(q + j, Vec::size());
      }
      for (; j < n; ++j) q[j] = static_cast<int8_t>(std::nearbyint(row[j] / scale));
    }
  });
}

// y (rows x o), which holds the int32 sums, becomes bias + (sums * r) * scale, in place.
void dequantize_rows(float* y, int64_t rows, int64_t o, const float* r, const float* scale, const float* bias) {
  at::parallel_for(0, rows, 0, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      float* row = y + m * o;
      const Vec row_scale(r[m]);
      int64_t j = 0;
      for (; j + Vec::size() <= o; j += Vec::size()) {
        // the same memory read as int32 (an unaligned vector load, which may alias), converted
        // in one instruction: through an array, element by element, the pass took 6x as long
        Vec v = at::vec::convert_to_fp_of_same_size<float>(IntVec::loadu(row + j)) * row_scale;
        at::vec::fmadd(v, Vec::loadu(scale + j), Vec::loadu(bias + j)).store(row + j);
      }
      for (; j < o; ++j) {
        int32_t sum;
        std::memcpy(&sum, row + j, sizeof(sum));
        row[j] = std::fma(static_cast<float>(sum) * r[m], scale[j], bias[j]);
      }
    }
  });
}

// Hypotheses [first, first + G) of sentence rows y (... x W) from one int8 row of weights.
template <int G>
void dot_products(const int8_t* q, const float* x, int64_t n, float scale, float bias, float* y, int64_t W) {
  Vec sums[G];
  for (int g = 0; g < G; ++g) sums[g] = Vec(0.0f);
  for (int64_t j = 0; j < n; j += Vec::size()) {
    // one load of Vec::size() bytes, sign-extended (a tail: a partial load, whose padding
    // meets the zeros of x's partial load)
    const int count = static_cast<int>(std::min<int64_t>(Vec::size(), n - j));
    const Vec w = at::vec::convert<float>(at::vec::convert_to_int32<int8_t>(q + j, count));
    for (int g = 0; g < G; ++g) sums[g] = at::vec::fmadd(w, Vec::loadu(x + g * n + j, count), sums[g]);
  }
  for (int g = 0; g < G; ++g) {
    const float sum = at::vec::vec_reduce_all<float>([](Vec a, Vec b) { return a + b; }, sums[g]);
    y[g * W] = bias + scale * sum;
  }
}

// Rows summed together by channel_sums: each row's two vectors of sums (12 of AVX2's 16 vector
// registers for 6 rows), the two channels' weights and the row's vector.
constexpr int kMaddGroup = 6;

// The int32 sums of rows p (R x n, int16, holding int8 values) with two output channels' int8
// weights q0 and q1 (n each): exact, as each 16-bit product (at most 127 x 127) and each
// pair's sum fit in AVX2's multiply-add of 16-bit pairs into 32 bits. Each row's vector is
// loaded once for both channels, and each channel's weights widened once for all R rows.
template <int R>
void channel_sums(const int16_t* p, int64_t n, const int8_t* q0, const int8_t* q1, int32_t* sums0, int32_t* sums1) {
  __m256i acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0 + k)));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q1 + k)));
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + r * n + k));
      acc0[r] = _mm256_add_epi32(acc0[r], _mm256_madd_epi16(w0, x));
      acc1[r] = _mm256_add_epi32(acc1[r], _mm256_madd_epi16(w1, x));
    }
  }
  for (int r = 0; r < R; ++r) {
    // the two channels' eight partial sums each, added pairwise, then the halves
    __m256i both = _mm256_hadd_epi32(acc0[r], acc1[r]);  // a0+a1 a2+a3 b0+b1 b2+b3 | a4+a5 a6+a7 b4+b5 b6+b7
    __m128i half = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
    half = _mm_hadd_epi32(half, half);  // a, b, a, b
    int32_t sum0 = _mm_cvtsi128_si32(half), sum1 = _mm_extract_epi32(half, 1);
    for (int64_t j = k; j < n; ++j) {
      sum0 += static_cast<int32_t>(q0[j]) * p[r * n + j];
      sum1 += static_cast<int32_t>(q1[j]) * p[r * n + j];
    }
    sums0[r] = sum0;
    sums1[r] = sum1;
  }
}

// channel_sums with VNNI: vpdpbusd adds to each 32-bit lane four products of an unsigned byte
// by a signed one, with no widening: 64 products an instruction on AVX-512's vectors, 32 on
// AVX2's, where AVX2's multiply-add of 16-bit pairs makes 16. The weights (within +-127) are
// made unsigned by adding 128, which flips their sign bit; the rows (p, int8) stay signed, so
//   sum_k (q_k + 128) p_k = sum_k q_k p_k + 128 sum_k p_k,
// and `shift` holds each row's 128 sum_k p_k over the vectors' part of k (vnni_vector_part).
// Exact: a lane's four products are at most 255 x 127 each, and no sum saturates (vpdpbusd, not
// vpdpbusds). vpdpbusd has two encodings, each of a CPU feature of its own: AVX-512 VNNI's, for
// builds for torch's AVX512 capability, and AVX-VNNI's, for AVX2 builds on CPUs with AVX-VNNI
// but no AVX-512 (Intel's client cores since Alder Lake, its E-core Xeons).
//
// Rows summed together (kVnniGroup): each row's two vectors of sums stay in registers, with the
// two channels' weights, the row's vector and the flip: 6 rows take 16 of AVX-512's 32 vector
// registers, and AVX2's 16 hold 4 (with 6, the AVX2 build spilled, and made its sums 0.80-0.85x
// as fast as AVX2's multiply-add; with 4, 1.25-1.33x, on an AMD EPYC with both encodings).
// A row's two sums from its vectors' sums (for channels q0 and q1): less the row's shift, plus
// the products past the vectors' part of k, one at a time.
inline void row_sums(const int8_t* row, int64_t n, int64_t vectors, const int8_t* q0, const int8_t* q1,
                     const int32_t* vector_sums, int32_t shift, int32_t* sum0, int32_t* sum1) {
  int32_t first = vector_sums[0] - shift, second = vector_sums[1] - shift;
  for (int64_t j = vectors; j < n; ++j) {
    first += static_cast<int32_t>(q0[j]) * row[j];
    second += static_cast<int32_t>(q1[j]) * row[j];
  }
  *sum0 = first;
  *sum1 = second;
}

#ifdef CPU_CAPABILITY_AVX512
// AVX-512's build sums on 512-bit vectors: a beam's 5 rows x 768 -> 512 in 11.4 us against 17.0
// on 256-bit ones, 5 x 256 -> 256 in 4.6 against 5.8 (the whole call, the rows' quantization and
// the sums' conversion with it; one thread, an AMD EPYC with AVX-512 VNNI).
constexpr int kVnniGroup = 6;
int64_t vnni_vector_part(int64_t n) { return n - n % 64; }

template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void channel_sums_vnni(
    const int8_t* p, int64_t n, const int8_t* q0, const int8_t* q1, const int32_t* shift, int32_t* sums0,
    int32_t* sums1) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();
  const int64_t vectors = vnni_vector_part(n);
  for (int64_t k = 0; k < vectors; k += 64) {
    const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(q0 + k), flip);
    const __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512(q1 + k), flip);
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_loadu_si512(p + r * n + k);
      acc0[r] = _mm512_dpbusd_epi32(acc0[r], w0, x);
      acc1[r] = _mm512_dpbusd_epi32(acc1[r], w1, x);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int32_t vector_sums[2] = {_mm512_reduce_add_epi32(acc0[r]), _mm512_reduce_add_epi32(acc1[r])};
    row_sums(p + r * n, n, vectors, q0, q1, vector_sums, shift[r], sums0 + r, sums1 + r);
  }
}
#else
constexpr int kVnniGroup = 4;
int64_t vnni_vector_part(int64_t n) { return n - n % 32; }

template <int R>
__attribute__((target("avxvnni"))) void channel_sums_vnni(const int8_t* p, int64_t n, const int8_t* q0,
                                                          const int8_t* q1, const int32_t* shift, int32_t* sums0,
                                                          int32_t* sums1) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_si256();
  const int64_t vectors = vnni_vector_part(n);
  for (int64_t k = 0; k < vectors; k += 32) {
    const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q0 + k)), flip);
    const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q1 + k)), flip);
    for (int r = 0; r < R; ++r) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + r * n + k));
      acc0[r] = _mm256_dpbusd_avx_epi32(acc0[r], w0, x);
      acc1[r] = _mm256_dpbusd_avx_epi32(acc1[r], w1, x);
    }
  }
  for (int r = 0; r < R; ++r) {
    // the two channels' eight partial sums each, added pairwise, then the halves
    __m256i both = _mm256_hadd_epi32(acc0[r], acc1[r]);
    __m128i half = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
    half = _mm_hadd_epi32(half, half);
    const int32_t vector_sums[2] = {_mm_cvtsi128_si32(half), _mm_extract_epi32(half, 1)};
    row_sums(p + r * n, n, vectors, q0, q1, vector_sums, shift[r], sums0 + r, sums1 + r);
  }
}
#endif

// Whether int8_few_rows makes its sums with VNNI: the CPU has the encoding this build uses.
bool vnni_available() {
#ifdef CPU_CAPABILITY_AVX512
  static const bool has = __builtin_cpu_supports("avx512vnni");
#else
  static const bool has = __builtin_cpu_supports("avxvnni");
#endif
  return has;
}

// group_sums of R rows, R the number `count` (1 <= count <= R) as a constant of the code.
template <int R, class GroupSums>
void group_of(int64_t count, const GroupSums& group_sums, int64_t m, int64_t j0, int64_t j1, int32_t* found0,
              int32_t* found1) {
  if constexpr (R > 1) {
    if (count < R) return group_of<R - 1>(count, group_sums, m, j0, j1, found0, found1);
  }
  group_sums(std::integral_constant<int, R>(), m, j0, j1, found0, found1);
}

// The int32 sums (rows x o) of every row with every output channel, two channels at a time and
// up to kGroup rows at a time: `group_sums(std::integral_constant<int, R>, m, j0, j1, found0,
// found1)` puts those of rows [m, m + R) with channels j0 and j1 in found0 and found1.
template <int kGroup, class GroupSums>
void every_channel_sums(int64_t rows, int64_t o, int32_t* sums, const GroupSums& group_sums) {
  at::parallel_for(0, (o + 1) / 2, 8, [&](int64_t begin, int64_t end) {
    int32_t found0[kGroup], found1[kGroup];
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t j = 2 * pair, j1 = std::min(j + 1, o - 1);  // an odd last channel: twice
      for (int64_t m = 0; m < rows; m += kGroup) {
        const int64_t count = std::min<int64_t>(kGroup, rows - m);
        group_of<kGroup>(count, group_sums, m, j, j1, found0, found1);
        for (int64_t g = 0; g < count; ++g) {
          sums[(m + g) * o + j] = found0[g];
          sums[(m + g) * o + j1] = found1[g];
        }
      }
    }
  });
}

// A product's float32 input x: rows x n, contiguous, on the CPU.
void check_input(const char* name, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(), name,
              " takes a contiguous 2-D float32 CPU input");
}

// A product's per-channel scale and bias (o each) and its output `out` (rows x o), float32, contiguous.
void check_output(const char* name, int64_t rows, int64_t o, const at::Tensor& scale, const at::Tensor& bias,
                  const at::Tensor& out) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == o &&
                  bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.numel() == o,
              name, ": scale and bias must be float32, one per output channel");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.dim() == 2 && out.size(0) == rows &&
                  out.size(1) == o,
              name, ": out must be a contiguous float32 rows x out tensor");
}

}  // namespace

// int8_linear's product for a few rows, with the sums made here rather than by torch._int_mm:
// x (rows x n, float32, contiguous) quantized per row as int8_linear quantizes it, times q
// (out x n, int8, contiguous: the layer's weights, each output channel's row read once for up
// to 8 rows at a time), the sums turned into `out` as int8_linear turns them: the same numbers,
// bit for bit, as int8_linear where torch._int_mm sums exactly.
at::Tensor int8_few_rows(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale, const at::Tensor& bias,
                         at::Tensor out, bool vnni) {
  check_input("int8_few_rows", x);
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous() && q.size(1) == x.size(1),
              "int8_few_rows: q must be a contiguous out x in int8 tensor");
  const int64_t rows = x.size(0), n = x.size(1), o = q.size(0);
  check_output("int8_few_rows", rows, o, scale, bias, out);
  auto p = at::empty({rows, n}, x.options().dtype(at::kChar));
  auto r = at::empty({rows}, x.options());
  quantize_rows(x.data_ptr<float>(), rows, n, p.data_ptr<int8_t>(), r.data_ptr<float>());
  const int8_t* qp = q.data_ptr<int8_t>();
  int32_t* sums = reinterpret_cast<int32_t*>(out.data_ptr<float>());  // converted in place below
  if (vnni && vnni_available()) {
    const int8_t* pp = p.data_ptr<int8_t>();
    std::vector<int32_t> shift(rows);  // each row's 128 x its sum over the vectors' part
    for (int64_t m = 0; m < rows; ++m) {
      int32_t sum = 0;  // held here, not in the vector, which int8 stores may alias: vectorized
      for (int64_t k = 0, end = vnni_vector_part(n); k < end; ++k) sum += pp[m * n + k];
      shift[m] = 128 * sum;
    }
    every_channel_sums<kVnniGroup>(rows, o, sums, [&](auto group, int64_t m, int64_t j0, int64_t j1,
                                                      int32_t* found0, int32_t* found1) {
      channel_sums_vnni<decltype(group)::value>(pp + m * n, n, qp + j0 * n, qp + j1 * n, shift.data() + m,
                                                found0, found1);
    });
  } else {
    const auto wide = p.to(at::kShort);
    const int16_t* pp = wide.data_ptr<int16_t>();
    every_channel_sums<kMaddGroup>(rows, o, sums, [&](auto group, int64_t m, int64_t j0, int64_t j1,
                                                      int32_t* found0, int32_t* found1) {
      channel_sums<decltype(group)::value>(pp + m * n, n, qp + j0 * n, qp + j1 * n, found0, found1);
    });
  }
  dequantize_rows(out.data_ptr<float>(), rows, o, r.data_ptr<float>(), scale.data_ptr<float>(),
                  bias.data_ptr<float>());
  return out;
}

// Each sentence's own int8 rows of weights times its hypotheses: q (S x W x n, int8, one
// `scale` and `bias` a row: S x W, float32) and h (S x B x n, float32), all contiguous, give
// y (S x B x W) with y[s][b][w] = bias[s][w] + scale[s][w] * (q[s][w] . h[s][b]). The weights
// are converted to float32 as they are read, so a row is read from memory once, in int8, for
// all B hypotheses of its sentence; the sums are float32's (within its rounding of torch's
// baddbmm of the same numbers, not bit for bit).
at::Tensor int8_rows_by_sentence(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& bias,
                                 const at::Tensor& h) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kChar && q.is_contiguous() && q.device().is_cpu(),
              "int8_rows_by_sentence: q must be a contiguous S x W x n int8 CPU tensor");
  const int64_t S = q.size(0), W = q.size(1), n = q.size(2);
  TORCH_CHECK(h.dim() == 3 && h.scalar_type() == at::kFloat && h.is_contiguous() && h.size(0) == S &&
                  h.size(2) == n,
              "int8_rows_by_sentence: h must be a contiguous S x B x n float32 tensor");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == S * W &&
                  bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.numel() == S * W,
              "int8_rows_by_sentence: scale and bias must be float32, S x W");
  const int64_t B = h.size(1);
  auto y = at::empty({S, B, W}, h.options());
  const int8_t* qp = q.data_ptr<int8_t>();
  const float *sp = scale.data_ptr<float>(), *bp = bias.data_ptr<float>(), *hp = h.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  constexpr int64_t kGroup = 8;  // hypotheses multiplied together: each has a vector of sums
  at::parallel_for(0, S * W, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t s = i / W, w = i % W;
      for (int64_t b = 0; b < B; b += kGroup) {
        const float* x = hp + (s * B + b) * n;
        float* out = yp + (s * B + b) * W + w;
        switch (std::min(kGroup, B - b)) {
          case 1: dot_products<1>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          case 2: dot_products<2>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          case 3: dot_products<3>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          case 4: dot_products<4>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          case 5: dot_products<5>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          case 6: dot_products<6>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          case 7: dot_products<7>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
          default: dot_products<8>(qp + i * n, x, n, sp[i], bp[i], out, W); break;
        }
      }
    }
  });
  return y;
}

// x (rows x n, float32, contiguous) times weight_t (n x o, int8, any strides; per output
// channel `scale`) plus `bias`, into `out` (rows x o, float32, contiguous), which is returned.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight_t, const at::Tensor& scale,
                       const at::Tensor& bias, at::Tensor out) {
  check_input("int8_linear", x);
  TORCH_CHECK(weight_t.dim() == 2 && weight_t.scalar_type() == at::kChar && weight_t.size(0) == x.size(1),
              "int8_linear: weight_t must be int8, in x out");
  const int64_t rows = x.size(0), n = x.size(1), o = weight_t.size(1);
  check_output("int8_linear", rows, o, scale, bias, out);
  auto p = at::empty({rows, n}, x.options().dtype(at::kChar));
  auto r = at::empty({rows}, x.options());
  quantize_rows(x.data_ptr<float>(), rows, n, p.data_ptr<int8_t>(), r.data_ptr<float>());
  auto sums = out.view(at::kInt);
  at::_int_mm_out(sums, p, weight_t);
  dequantize_rows(out.data_ptr<float>(), rows, o, r.data_ptr<float>(), scale.data_ptr<float>(),
                  bias.data_ptr<float>());
  return out;
}

// torch.ops.convs2s.int8_linear on the CPU. The process chooses each shape's product in Python
// (int8_linear.py: measured, or pinned); where it chose one of this file's, it says so here
// (remember_product) and the operation runs it from then on without Python: a call from an
// exported program through Python's dispatch cost more than the product of a beam's rows itself.
// Every other call (a shape not chosen yet, fbgemm's product, weights not float32 and CPU) is
// handed to Python's implementation, which chooses, remembers and multiplies.
namespace {

enum class Product { few_rows, int_mm };
// (rows, in, out, weights stored out x in) -> the product chosen for them
using Shape = std::tuple<int64_t, int64_t, int64_t, bool>;
std::mutex products_lock;
std::map<Shape, Product> products;
pybind11::object* choose_in_python = nullptr;  // set once, kept for the life of the process
std::atomic<int64_t> handed_to_python{0};

Shape shape_of(const at::Tensor& rows, const at::Tensor& weight_t) {
  // weight_t (in x out) the transpose of contiguous out x in weights, the layers' layout: the
  // same test as int8_linear.py's few_rows_chosen
  return {rows.size(0), weight_t.size(0), weight_t.size(1), weight_t.t().is_contiguous()};
}

at::Tensor int8_linear_op(const at::Tensor& rows, const at::Tensor& weight_t, const at::Tensor& scale,
                          const at::Tensor& bias) {
  if (rows.dim() == 2 && weight_t.dim() == 2 && rows.scalar_type() == at::kFloat &&
      weight_t.scalar_type() == at::kChar) {
    const Shape shape = shape_of(rows, weight_t);
    std::optional<Product> product;
    {
      std::lock_guard<std::mutex> hold(products_lock);
      const auto found = products.find(shape);
      if (found != products.end()) product = found->second;
    }
    if (product) {
      auto out = at::empty({rows.size(0), weight_t.size(1)}, rows.options());
      if (*product == Product::few_rows) return int8_few_rows(rows.contiguous(), weight_t.t(), scale, bias, out, true);
      return int8_linear(rows.contiguous(), weight_t, scale, bias, out);
    }
  }
  ++handed_to_python;
  pybind11::gil_scoped_acquire gil;
  return (*choose_in_python)(rows, weight_t, scale, bias).cast<at::Tensor>();
}

// From now on this process's calls of torch.ops.convs2s.int8_linear on the CPU come here first;
// `choose` (Python's implementation) takes those that are handed back. Once a process.
void serve_operation(pybind11::object choose) {
  static std::once_flag once;
  std::call_once(once, [&] {
    choose_in_python = new pybind11::object(std::move(choose));  // never freed: called up to the process's exit
    static torch::Library library(torch::Library::IMPL, "convs2s", c10::DispatchKey::CPU, __FILE__, __LINE__);
    library.impl("int8_linear", TORCH_FN(int8_linear_op));
  });
}

// The operation runs `product` ("few_rows" or "int_mm") for these rows and weights from now on.
void remember_product(const at::Tensor& rows, const at::Tensor& weight_t, const std::string& product) {
  TORCH_CHECK(product == "few_rows" || product == "int_mm", "remember_product: few_rows or int_mm, not ", product);
  TORCH_CHECK(rows.dim() == 2 && weight_t.dim() == 2, "remember_product: 2-D rows and weights");
  std::lock_guard<std::mutex> hold(products_lock);
  products[shape_of(rows, weight_t)] = product == "few_rows" ? Product::few_rows : Product::int_mm;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // other Python threads run while the kernels work, as they do during torch's own operations
  const auto without_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("int8_linear", &int8_linear, "a linear layer in int8: rows quantized, int8 product, sums scaled in place",
        without_gil);
  m.def("int8_few_rows", &int8_few_rows,
        "int8_linear for a few rows, its exact int32 sums made here: with VNNI where `vnni` and the CPU has it",
        pybind11::arg("x"), pybind11::arg("q"), pybind11::arg("scale"), pybind11::arg("bias"), pybind11::arg("out"),
        pybind11::arg("vnni") = true, without_gil);
  m.def("vnni_available", &vnni_available,
        "whether int8_few_rows can make its sums with VNNI (AVX-512 VNNI or AVX-VNNI, as built)");
  m.def("int8_rows_by_sentence", &int8_rows_by_sentence, "each sentence's int8 rows times its hypotheses",
        without_gil);
  m.def("serve_operation", &serve_operation, "torch.ops.convs2s.int8_linear on the CPU: here, else `choose`");
  m.def("remember_product", &remember_product, "the operation's product for these rows and weights, from now on");
  m.def("handed_to_python", [] { return handed_to_python.load(); }, "the operation's calls handed to Python");
}
