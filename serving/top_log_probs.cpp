// Each row's log-probabilities at its special symbols and its k best other words, from its
// logits, with the row read once from memory (its maximum and its k best words in one pass,
// then the sum of exp(x - max) from cache): torch's log_softmax values, bit for bit.
//
// top_log_probs.py compiles this for the CPU capability that torch dispatches to
// (CPU_CAPABILITY_AVX2 or CPU_CAPABILITY_AVX512), so that the at::vec functions below are
// those that torch's own kernel runs, in the same order:
// serial_vec_log_softmax_lastdim_range in ATen/native/cpu/LogSoftmaxKernelImpl.h.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// The k largest values offered, and their indices, best first (ties: the first offered).
class Best {
 public:
  explicit Best(int64_t k) : value_(k), index_(k) {}

  // x[first:first + k] taken as they are, the values every later one is offered against.
  void take(const float* x, int64_t first) {
    for (int64_t j = first; j < first + size(); ++j) insert(x[j], j, j - first);
  }

  // x[j], offered.
  void offer(float x, int64_t j) {
    if (x > value_.back()) insert(x, j, size() - 1);
  }

  // v = x[j:j + Vec::size()], offered: one comparison where none of them is better than the k-th.
  void offer(const Vec& v, const float* x, int64_t j) {
    const int none_above = (1 << Vec::size()) - 1;  // zero_mask() of a comparison true nowhere
    if ((v > Vec(value_.back())).zero_mask() == none_above) return;
    for (int64_t l = j; l < j + Vec::size(); ++l) offer(x[l], l);
  }

  int64_t size() const { return value_.size(); }
  float value(int64_t i) const { return value_[i]; }
  int64_t index(int64_t i) const { return index_[i]; }

 private:
  // x into place `last` or above, the values below it moving down one place.
  void insert(float x, int64_t j, int64_t last) {
    int64_t p = last;
    for (; p > 0 && x > value_[p - 1]; --p) {
      value_[p] = value_[p - 1];
      index_[p] = index_[p - 1];
    }
    value_[p] = x;
    index_[p] = j;
  }

  std::vector<float> value_;
  std::vector<int64_t> index_;
};

// The maximum of x[0:width] (NaN if one is NaN, as torch's), and the k best of
// x[begin:end] into `best`, in one read of the row: a maximum is the same in any order.
float max_and_best(const float* x, int64_t width, int64_t begin, int64_t end, Best& best) {
  best.take(x, begin);
  const int64_t first = begin + best.size();  // the first word offered
  Vec max_vec(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + Vec::size() <= width; j += Vec::size()) {
    const Vec v = Vec::loadu(x + j);
    max_vec = at::vec::maximum(max_vec, v);
    if (j >= first && j + Vec::size() <= end) {
      best.offer(v, x, j);
    } else {
      for (int64_t l = std::max(j, first); l < std::min(j + Vec::size(), end); ++l) best.offer(x[l], l);
    }
  }
  if (j < width) {  // the tail, as a vector whose other lanes are -inf
    const Vec tail = Vec::set(Vec(-std::numeric_limits<float>::infinity()), Vec::loadu(x + j, width - j), width - j);
    max_vec = at::vec::maximum(max_vec, tail);
    for (int64_t l = std::max(j, first); l < end; ++l) best.offer(x[l], l);
  }
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, max_vec);
}

}  // namespace

// logits: rows x width, float32, contiguous, whose columns from `words_end` on are not words
// (they count in the normaliser only). Returns the log-probabilities of the first `nspecial`
// columns and of the k best of the others before `words_end`, best first
// (rows x (nspecial + k)), and those k columns (rows x k).
std::vector<at::Tensor> log_softmax_top_k(const at::Tensor& logits, int64_t nspecial, int64_t k, int64_t words_end) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous() &&
                  logits.device().is_cpu(),
              "log_softmax_top_k takes a contiguous 2-D float32 CPU tensor");
  const int64_t rows = logits.size(0), width = logits.size(1);
  TORCH_CHECK(nspecial >= 0 && k >= 1 && nspecial + k <= words_end && words_end <= width,
              "log_softmax_top_k: k, nspecial or words_end out of range");
  auto log_probs = at::empty({rows, nspecial + k}, logits.options());
  auto columns = at::empty({rows, k}, logits.options().dtype(at::kLong));
  const float* in = logits.data_ptr<float>();
  float* out = log_probs.data_ptr<float>();
  int64_t* out_columns = columns.data_ptr<int64_t>();
  at::parallel_for(0, rows, 0, [&](int64_t begin, int64_t end) {
    Best best(k);
    for (int64_t r = begin; r < end; ++r) {
      const float* x = in + r * width;
      // log_softmax(x) = x - max - log(sum(exp(x - max))), as torch computes it
      const float max = max_and_best(x, width, nspecial, words_end, best);
      float log_sum = at::vec::map_reduce_all<float>(
          [max](Vec v) { return (v - Vec(max)).exp(); }, [](Vec a, Vec b) { return a + b; }, x, width);
      at::vec::map([](Vec v) { return v.log(); }, &log_sum, &log_sum, 1);
      float* y = out + r * (nspecial + k);
      for (int64_t j = 0; j < nspecial; ++j) y[j] = x[j] - max - log_sum;
      for (int64_t i = 0; i < k; ++i) {
        y[nspecial + i] = best.value(i) - max - log_sum;
        out_columns[r * k + i] = best.index(i);
      }
    }
  });
  return {log_probs, columns};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // other Python threads run while the kernel works, as they do during torch's own operations
  m.def("log_softmax_top_k", &log_softmax_top_k, "log_softmax at each row's special symbols and k best other words",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
