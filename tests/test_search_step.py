"""The exported runtime's beam step bookkeeping in C++ (convs2s_serving.search_step): the
hypotheses, scores and positional scores of torch's operations, bit for bit, on a real
exported model's search; torch's operations, with a warning, where the kernel cannot be had.
(test_export.py compares the same search with fairseq-generate's.)"""
import shutil

import pytest
import torch
from convs2s_serving import kernels, search_step

from cli_helpers import in_python

CAPABILITY = torch.backends.cpu.get_cpu_capability()
needs_kernel = pytest.mark.skipif(
    CAPABILITY not in kernels.CAPABILITY_FLAGS or shutil.which("c++") is None,
    reason=f"no kernel for torch's CPU capability {CAPABILITY} or no C++ compiler",
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(a random tiny model exported, a batch of left-padded sources of varied lengths)."""
    from fairseq_convs2s_ext.generation.export import export
    from model_helpers import build, with_random_biases

    torch.manual_seed(0)
    model, d = build()
    with_random_biases(model)
    model.make_generation_fast_()
    folder = tmp_path_factory.mktemp("search_step") / "exported"
    export(model, folder)
    lengths = [9, 3, 6, 2, 9, 5]
    src_tokens = torch.full((len(lengths), max(lengths)), d.pad())
    for row, length in enumerate(lengths):
        src_tokens[row, max(lengths) - length:-1] = torch.randint(d.nspecial, len(d), (length - 1,))
        src_tokens[row, -1] = d.eos()
    return folder, src_tokens


@needs_kernel
def test_the_kernel_is_built_and_used_on_this_cpu():
    assert search_step.load() is not None


@needs_kernel
@pytest.mark.parametrize("options", [
    dict(beam=5, max_len_b=12),
    dict(beam=1, max_len_b=8),  # greedy
    dict(beam=4, lenpen=0.6, min_len=3, max_len_a=0.5, max_len_b=4),  # sentences end at their longest
    dict(beam=3, unkpen=-3.0, max_len_b=10),
    dict(beam=5, min_len=7, max_len_b=7),  # every hypothesis the same length: eos at the last step only
])
def test_the_kernel_finds_the_hypotheses_of_torch_operations_bit_for_bit(exported, options, monkeypatch):
    from convs2s_serving import ExportedModel, SearchOptions, beam_search

    folder, src_tokens = exported
    model, search = ExportedModel(folder), SearchOptions(**options)
    with torch.inference_mode():
        found = beam_search(model, src_tokens, search)
        monkeypatch.setattr(search_step, "load", lambda: None)  # torch's operations do the work
        expected = beam_search(model, src_tokens, search)
    assert [len(h) for h in found] == [options["beam"]] * len(src_tokens)
    for ours, theirs in zip(found, expected):
        assert [h.tokens.tolist() for h in ours] == [h.tokens.tolist() for h in theirs]
        assert [h.score for h in ours] == [h.score for h in theirs]
        assert all(torch.equal(h.positional_scores, e.positional_scores) for h, e in zip(ours, theirs))


def test_without_vectorized_code_torch_operations_search_with_a_warning(exported):
    folder, src_tokens = exported
    code = ("import logging, sys, torch; logging.basicConfig()\n"
            "from convs2s_serving import ExportedModel, SearchOptions, beam_search, search_step\n"
            f"found = beam_search(ExportedModel({str(folder)!r}), torch.tensor({src_tokens.tolist()}), "
            "SearchOptions(beam=2, max_len_b=5))\n"
            "print(search_step.load(), [len(h) for h in found])")
    output = in_python(code, ATEN_CPU_CAPABILITY="default")
    assert "search_step kernel is not used (no build for torch's CPU capability DEFAULT)" in output
    assert output.splitlines()[-1] == f"None {[2] * len(src_tokens)}"
