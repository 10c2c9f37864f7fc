// A beam step's bookkeeping (search.py's beam_search, fairseq's search.BeamSearch.step and the
// reordering of SequenceGenerator._generate), in two calls a step instead of some sixty torch
// operations dispatched from Python, each of which costs microseconds on a beam's few rows:
//
//   candidates: each hypothesis's scores masked as fairseq masks them, its score so far added,
//     the sentence's 2 x beam best continuations taken (torch's topk, so ties fall as there),
//     with their target ids, the beams they continue, and which of them end;
//   advance: the beam best that do not end, in the candidates' order, become the hypotheses:
//     tokens and scores reordered and extended, the decoder's windows reordered.
//
// Between the two, search.py finalizes the hypotheses that end and drops finished sentences.
// The same numbers as search.py's torch operations (_candidates_torch, _advance_torch), which
// search_step.py checks on random inputs before the kernel is used.
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

namespace {

void check(bool ok, const char* what) { TORCH_CHECK(ok, "search_step: ", what); }

}  // namespace

// lprobs (rows x width, float32, contiguous; changed in place): each hypothesis's log-probabilities
// at the nspecial special symbols (columns 0..nspecial-1, whose ids are their columns), then at
// its best words, whose local columns are `columns` (rows x width - nspecial) and whose target ids
// are `candidates[sentence][column]` (sentences x C), or the columns themselves where none is
// given. rows is bsz * beam, or bsz at the first step (a row a sentence). scores (bsz * beam
// hypotheses x max_len + 1 steps) holds their scores so far; cands_to_ignore (bsz x beam, bool) the
// candidates that advance kept though they end. Returns each sentence's best k continuations
// (bsz x k): scores, target ids, the beam each continues, whether it ends (eos, a finite score,
// not to be ignored), and whether any of the first beam of them ends.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, bool> candidates(
    at::Tensor lprobs, const at::Tensor& columns, const c10::optional<at::Tensor>& candidates,
    const at::Tensor& scores, const at::Tensor& cands_to_ignore, int64_t step, int64_t bsz, int64_t beam,
    int64_t nspecial, int64_t eos, int64_t pad, int64_t unk, double unkpen, int64_t max_len, int64_t min_len,
    int64_t cand_size) {
  check(lprobs.dim() == 2 && lprobs.scalar_type() == at::kFloat && lprobs.is_contiguous(),
        "lprobs must be a contiguous rows x width float32 tensor");
  const int64_t rows = lprobs.size(0), width = lprobs.size(1), per_sentence = rows / bsz;
  check(per_sentence * bsz == rows && (per_sentence == 1 || per_sentence == beam) && width > nspecial &&
            eos < nspecial && pad < nspecial && unk < nspecial,
        "lprobs must have a row a sentence or a hypothesis, the special symbols first");
  check(columns.dim() == 2 && columns.scalar_type() == at::kLong && columns.is_contiguous() &&
            columns.size(0) == rows && columns.size(1) == width - nspecial,
        "columns must be a contiguous rows x words int64 tensor");
  check(scores.dim() == 2 && scores.scalar_type() == at::kFloat && scores.size(0) == bsz * beam &&
            scores.size(1) > std::max<int64_t>(step - 1, 0) && scores.stride(1) == 1,
        "scores must be a hypotheses x steps float32 tensor");
  check(cands_to_ignore.scalar_type() == at::kBool && cands_to_ignore.is_contiguous() &&
            cands_to_ignore.numel() == bsz * beam,
        "cands_to_ignore must be a contiguous bsz x beam bool tensor");
  const int64_t* ids = nullptr;
  int64_t id_columns = 0;
  if (candidates) {
    check(candidates->dim() == 2 && candidates->scalar_type() == at::kLong && candidates->is_contiguous() &&
              candidates->size(0) == bsz,
          "candidates must be a contiguous sentences x words int64 tensor");
    ids = candidates->data_ptr<int64_t>();
    id_columns = candidates->size(1);
  }

  float* lp = lprobs.data_ptr<float>();
  const float inf = std::numeric_limits<float>::infinity();
  const float* previous = step > 0 ? scores.data_ptr<float>() + (step - 1) : nullptr;
  const int64_t score_stride = scores.stride(0);
  for (int64_t r = 0; r < rows; ++r) {
    float* x = lp + r * width;
    x[pad] = -inf;
    x[unk] -= static_cast<float>(unkpen);
    if (step >= max_len) {
      for (int64_t j = 0; j < width; ++j) {
        if (j != eos) x[j] = -inf;
      }
    }
    if (step < min_len) x[eos] = -inf;
    if (previous != nullptr) {
      const float so_far = previous[r * score_stride];
      for (int64_t j = 0; j < width; ++j) x[j] += so_far;
    }
  }
  const auto flat = lprobs.view({bsz, per_sentence * width});
  const int64_t k = std::min(cand_size, flat.size(1) - 1);
  check(k >= beam, "a sentence must offer at least beam + 1 continuations");
  auto top = at::topk(flat, k, 1, true, true);
  const at::Tensor& cand_scores = std::get<0>(top);
  const at::Tensor& index = std::get<1>(top);

  auto cand_indices = at::empty({bsz, k}, index.options());
  auto cand_beams = at::empty({bsz, k}, index.options());
  auto eos_mask = at::empty({bsz, k}, index.options().dtype(at::kBool));
  const int64_t* ip = index.data_ptr<int64_t>();
  const float* sp = cand_scores.data_ptr<float>();
  const int64_t* cp = columns.data_ptr<int64_t>();
  const bool* ignore = cands_to_ignore.data_ptr<bool>();
  int64_t* tp = cand_indices.data_ptr<int64_t>();
  int64_t* bp = cand_beams.data_ptr<int64_t>();
  bool* ep = eos_mask.data_ptr<bool>();
  bool any_eos = false;
  for (int64_t s = 0; s < bsz; ++s) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t i = s * k + c, within = ip[i] / width, column = ip[i] % width;
      int64_t id = column;
      if (column >= nspecial) {
        id = cp[(s * per_sentence + within) * (width - nspecial) + column - nspecial];
        if (ids != nullptr) {
          check(id >= 0 && id < id_columns, "a column beyond the sentence's candidates");
          id = ids[s * id_columns + id];
        }
      }
      tp[i] = id;
      bp[i] = within;
      ep[i] = id == eos && sp[i] != -inf && !(c < beam && ignore[s * beam + c]);
      any_eos = any_eos || (c < beam && ep[i]);
    }
  }
  return {cand_scores, cand_indices, cand_beams, eos_mask, any_eos};
}

// The beam best candidates of each sentence that do not end (those that end, or were to be
// ignored, after all the others where fewer than beam do not), in the candidates' order,
// become its hypotheses: tokens (bsz * beam x max_len + 2, int64) and scores (bsz * beam x
// max_len + 1, float32) reordered up to the step and extended by the candidate's id and score;
// each window (bsz x beam x ..., an expanded view at the first step) reordered. Returns the new
// cands_to_ignore (bsz x beam, bool: the chosen that end) and the windows.
std::tuple<at::Tensor, std::vector<at::Tensor>> advance(
    const at::Tensor& eos_mask, const at::Tensor& cands_to_ignore, const at::Tensor& cand_beams,
    const at::Tensor& cand_indices, const at::Tensor& cand_scores, at::Tensor tokens, at::Tensor scores,
    const std::vector<at::Tensor>& windows, int64_t step, int64_t beam) {
  const int64_t bsz = eos_mask.size(0), k = eos_mask.size(1);
  check(eos_mask.scalar_type() == at::kBool && eos_mask.is_contiguous() && k >= beam,
        "eos_mask must be a contiguous bsz x k bool tensor, k at least beam");
  check(cands_to_ignore.scalar_type() == at::kBool && cands_to_ignore.is_contiguous() &&
            cands_to_ignore.numel() == bsz * beam,
        "cands_to_ignore must be a contiguous bsz x beam bool tensor");
  for (const at::Tensor* t : {&cand_beams, &cand_indices, &cand_scores}) {
    check(t->is_contiguous() && t->dim() == 2 && t->size(0) == bsz && t->size(1) == k,
          "the candidates must be contiguous bsz x k tensors");
  }
  check(cand_beams.scalar_type() == at::kLong && cand_indices.scalar_type() == at::kLong &&
            cand_scores.scalar_type() == at::kFloat,
        "the candidates' beams and ids are int64, their scores float32");
  check(tokens.scalar_type() == at::kLong && tokens.is_contiguous() && tokens.size(0) == bsz * beam &&
            tokens.size(1) > step + 1,
        "tokens must be a contiguous hypotheses x positions int64 tensor");
  check(scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.size(0) == bsz * beam &&
            scores.size(1) > step,
        "scores must be a contiguous hypotheses x steps float32 tensor");

  const bool* ends = eos_mask.data_ptr<bool>();
  const bool* ignore = cands_to_ignore.data_ptr<bool>();
  auto next_ignore = at::empty({bsz, beam}, cands_to_ignore.options());
  bool* ni = next_ignore.data_ptr<bool>();
  auto chosen_rows = at::empty({bsz * beam}, cand_beams.options());
  int64_t* from = chosen_rows.data_ptr<int64_t>();
  std::vector<int64_t> chosen(bsz * beam);
  for (int64_t s = 0; s < bsz; ++s) {
    int64_t taken = 0;
    // fairseq's topk of (ends x cand_size + position), smallest first: those that go on, then the others
    for (int pass = 0; pass < 2 && taken < beam; ++pass) {
      for (int64_t c = 0; c < k && taken < beam; ++c) {
        const bool stops = ends[s * k + c] || (c < beam && ignore[s * beam + c]);
        if (stops == (pass == 1)) {
          chosen[s * beam + taken] = s * k + c;
          ni[s * beam + taken] = stops;
          from[s * beam + taken] = s * beam + cand_beams.data_ptr<int64_t>()[s * k + c];
          ++taken;
        }
      }
    }
  }

  const int64_t hypotheses = bsz * beam;
  const int64_t* ids = cand_indices.data_ptr<int64_t>();
  const float* cs = cand_scores.data_ptr<float>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  float* sp = scores.data_ptr<float>();
  const int64_t tstride = tokens.size(1), sstride = scores.size(1);
  std::vector<int64_t> old_tokens(hypotheses * (step + 1));
  std::vector<float> old_scores(hypotheses * step);
  for (int64_t h = 0; h < hypotheses; ++h) {
    std::memcpy(old_tokens.data() + h * (step + 1), tp + h * tstride, (step + 1) * sizeof(int64_t));
    std::memcpy(old_scores.data() + h * step, sp + h * sstride, step * sizeof(float));
  }
  for (int64_t h = 0; h < hypotheses; ++h) {
    std::memcpy(tp + h * tstride, old_tokens.data() + from[h] * (step + 1), (step + 1) * sizeof(int64_t));
    tp[h * tstride + step + 1] = ids[chosen[h]];
    std::memcpy(sp + h * sstride, old_scores.data() + from[h] * step, step * sizeof(float));
    sp[h * sstride + step] = cs[chosen[h]];
  }

  std::vector<at::Tensor> reordered;
  reordered.reserve(windows.size());
  for (const at::Tensor& w : windows) {
    check(w.dim() >= 2 && w.size(0) == bsz && w.size(1) == beam, "each window must be bsz x beam x ...");
    std::vector<int64_t> rows_shape{-1};
    rows_shape.insert(rows_shape.end(), w.sizes().begin() + 2, w.sizes().end());
    reordered.push_back(at::index_select(w.reshape(rows_shape), 0, chosen_rows).view(w.sizes()));
  }
  return {next_ignore, reordered};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto without_gil = pybind11::call_guard<pybind11::gil_scoped_release>();
  m.def("candidates", &candidates, "each sentence's best continuations, their ids, beams and ends", without_gil);
  m.def("advance", &advance, "the beam best that go on become the hypotheses: tokens, scores, windows reordered",
        without_gil);
}
