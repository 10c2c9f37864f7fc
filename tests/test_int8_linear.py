"""The int8 linear layer's kernel: the same numbers, bit for bit, as its torch operations,
and those operations, with a warning, where the kernel cannot be had; its product of each
sentence's int8 rows by its hypotheses within float32's rounding of torch's; fbgemm's product,
where torch._int_mm is slow, within the bound of its 7-bit activations, its weights packed once;
and the choice between the two."""
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest
import torch

from cli_helpers import in_python
from conftest import ROOT
from convs2s_serving import int8_linear, kernels

CAPABILITY = torch.backends.cpu.get_cpu_capability()
needs_kernel = pytest.mark.skipif(
    CAPABILITY not in kernels.CAPABILITY_FLAGS or shutil.which("c++") is None,
    reason=f"no kernel for torch's CPU capability {CAPABILITY} or no C++ compiler",
)


def operands(rows, width, out, seed, stored="out x in"):
    """x, weight_t (in x out: the transpose of weights stored out x in, as the layers store
    them, or stored in x out, as exports written before them pass them), scale, bias."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator) * 4
    weight = torch.randint(-127, 128, (out, width), generator=generator, dtype=torch.int8)
    weight_t = weight.t() if stored == "out x in" else weight.t().contiguous()
    return x, weight_t, torch.rand(out, generator=generator) / 50, torch.randn(out, generator=generator)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stored", ["out x in", "in x out"])
@pytest.mark.parametrize("rows, width, out", [
    (1, 3, 2),  # narrower than a vector
    (9, 37, 21),  # tails after the vectors
    (640, 256, 512),  # a decoder layer's
    (640, 768, 512),  # the encoder's convolution, a source word's window
    (130, 256, 9792),  # W_o
])
def test_the_same_numbers_as_the_torch_operations(rows, width, out, threads, stored):
    x, weight_t, scale, bias = operands(rows, width, out, seed=rows + width, stored=stored)
    x[rows // 2] = 0  # a row's scale is TINY
    x[-1, :2] = torch.tensor([1e30, -1e-30])  # a row of one large value
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = int8_linear.KERNEL.load().int8_linear(x, weight_t, scale, bias, torch.full((rows, out), float("nan")))
    finally:
        torch.set_num_threads(previous)
    expected = int8_linear.int8_linear_torch(x, weight_t, scale, bias)
    assert torch.equal(got, expected)


@needs_kernel
@pytest.mark.parametrize("vnni", [True, False], ids=["VNNI where the CPU has it", "AVX2"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width, out", [
    (1, 3, 2),  # narrower than a vector
    (5, 37, 21),  # a beam; tails after the vectors; an odd last channel
    (6, 256, 512),  # a group of rows, at a decoder layer's shape
    (7, 768, 512),  # a group and one row more, at the convolutions' shape
    (13, 40, 9),  # three groups
    (5, 256, 9792),  # W_o
    (3, 70, 5),  # a vector of AVX-512 VNNI's 64 bytes, or two of AVX-VNNI's 32, and a tail
    (4, 150, 7),  # two of AVX-512 VNNI's vectors and a tail
])
def test_a_few_rows_are_the_same_numbers_as_with_exact_sums(rows, width, out, threads, vnni):
    """int8_few_rows: int8_linear's numbers, bit for bit, where torch._int_mm sums exactly
    (its products of the extreme values included), with VNNI's dot products where the CPU has
    them and with AVX2's."""
    x, weight_t, scale, bias = operands(rows, width, out, seed=rows + width)
    weight_t[:, 0], weight_t[:, -1] = 127, -127  # the largest products, both signs
    x[rows // 2] = 0  # a row's scale is TINY
    x[-1, :2] = torch.tensor([1e30, -1e-30])  # a row of one large value
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = int8_linear.KERNEL.load().int8_few_rows(x, weight_t.t(), scale, bias,
                                                      torch.full((rows, out), float("nan")), vnni=vnni)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(got, int8_linear.int8_linear_torch(x, weight_t, scale, bias, int8_linear.exact_int_mm))


@needs_kernel
def test_a_few_rows_are_summed_with_vnni_exactly_where_the_build_and_the_cpu_have_it():
    """VNNI's dot products are used where the kernel is built for torch's AVX512 capability and
    the CPU lists avx512_vnni, or built for AVX2 and the CPU lists avx_vnni; and the AVX2
    build's (held to AVX2 by ATEN_CPU_CAPABILITY: AVX-VNNI's encoding) are exact too."""
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    expected = {"AVX512": "avx512_vnni", "AVX2": "avx_vnni"}.get(CAPABILITY) in flags
    assert int8_linear.KERNEL.load().vnni_available() == expected
    if CAPABILITY != "AVX512":
        return
    code = ("import sys, torch\n"
            "sys.path.insert(0, 'tests')\n"
            "from convs2s_serving import int8_linear\n"
            "from test_int8_linear import operands\n"
            "kernel = int8_linear.KERNEL.load()\n"
            "same = []\n"
            "for rows, width, out in [(5, 37, 21), (6, 256, 512), (7, 768, 512), (13, 40, 9), (3, 70, 5), (4, 150, 7)]:\n"
            "    x, weight_t, scale, bias = operands(rows, width, out, seed=rows + width)\n"
            "    weight_t[:, 0], weight_t[:, -1] = 127, -127\n"
            "    got = kernel.int8_few_rows(x, weight_t.t(), scale, bias, torch.empty(rows, out))\n"
            "    same.append(torch.equal(got, int8_linear.int8_linear_torch(x, weight_t, scale, bias,\n"
            "                                                               int8_linear.exact_int_mm)))\n"
            "print(torch.backends.cpu.get_cpu_capability(), kernel.vnni_available(), all(same))")
    output = in_python(code, ATEN_CPU_CAPABILITY="avx2")
    assert output.splitlines()[-1] == f"AVX2 {'avx_vnni' in flags} True"


@needs_kernel
def test_a_few_rows_take_the_product_measured_the_faster_at_their_shape(monkeypatch):
    """A beam's rows: int8_few_rows or the process's product, whichever measured the faster at
    that shape (once, then kept; outputs in buckets, so that W_o's rows of each sentence's
    candidates, as many as it has, are not measured again for every sentence); not for weights
    stored in x out, nor where the product is pinned; more rows always take the process's
    product."""
    monkeypatch.delenv(int8_linear.PRODUCT_ENV, raising=False)
    product = int8_linear.chosen_product()
    x, weight_t, scale, bias = operands(5, 40, 30, seed=7)
    few = int8_linear.few_rows_chosen(5, weight_t, product)
    assert int8_linear._FEW_ROWS[(5, 40, int8_linear.OUT_BUCKET, product)] == few
    measured = len(int8_linear._FEW_ROWS)
    for out in (29, 31, int8_linear.OUT_BUCKET):
        assert int8_linear.few_rows_chosen(5, operands(5, 40, out, seed=7)[1], product) == few
    assert len(int8_linear._FEW_ROWS) == measured
    expected = int8_linear.int8_linear(x, weight_t, scale, bias, product="few_rows" if few else product)
    assert torch.equal(int8_linear.int8_linear(x, weight_t, scale, bias), expected)
    if few:  # the numbers of exact sums, which fbgemm's 7-bit rows do not give
        assert torch.equal(expected, int8_linear.int8_linear_torch(x, weight_t, scale, bias, int8_linear.exact_int_mm))
    assert not int8_linear.few_rows_chosen(5, weight_t.contiguous(), product)
    with pytest.raises(ValueError, match="stored out x in"):
        int8_linear.int8_linear(x, weight_t.contiguous(), scale, bias, product="few_rows")
    x, *_ = operands(int8_linear.FEW_ROWS + 1, 40, 30, seed=7)
    assert torch.equal(int8_linear.int8_linear(x, weight_t, scale, bias),
                       int8_linear.int8_linear(x, weight_t, scale, bias, product=product))
    monkeypatch.setenv(int8_linear.PRODUCT_ENV, product)
    x, weight_t, scale, bias = operands(3, 40, 30, seed=8)
    assert not int8_linear.few_rows_chosen(3, weight_t, product)
    assert torch.equal(int8_linear.int8_linear(x, weight_t, scale, bias),
                       int8_linear.int8_linear(x, weight_t, scale, bias, product=product))


@needs_kernel
@pytest.mark.parametrize("rows, stored", [(5, "out x in"), (5, "in x out"), (int8_linear.FEW_ROWS + 3, "out x in")])
def test_the_operation_runs_the_product_chosen_for_its_shape_without_python(rows, stored, monkeypatch):
    """torch.ops.convs2s.int8_linear (what an exported int8 program calls) on the CPU: the
    numbers of int8_linear's product chosen for the shape; the first call at a shape handed to
    Python, which chooses, and the next ones run by the C++ kernel where the product chosen is
    one of its own (few_rows, int_mm), else handed back again (fbgemm)."""
    monkeypatch.delenv(int8_linear.PRODUCT_ENV, raising=False)
    kernel = int8_linear.KERNEL.load()
    x, weight_t, scale, bias = operands(rows, 48, 26 + rows, seed=rows, stored=stored)  # a shape of its own
    product = int8_linear._product_for(rows, weight_t, kernel)
    expected = int8_linear.int8_linear(x, weight_t, scale, bias, product=product)
    handed = kernel.handed_to_python()
    with torch.inference_mode():  # as a program runs
        first = torch.ops.convs2s.int8_linear(x, weight_t, scale, bias)
        assert kernel.handed_to_python() == handed + 1
        for seed in range(3):  # other values, the same shape
            x = operands(rows, 48, 26 + rows, seed=seed)[0]
            assert torch.equal(torch.ops.convs2s.int8_linear(x, weight_t, scale, bias),
                               int8_linear.int8_linear(x, weight_t, scale, bias, product=product))
    assert torch.equal(first, expected)
    assert kernel.handed_to_python() == handed + 1 + (3 if product == "fbgemm" else 0)
    assert product != "few_rows" or (stored == "out x in" and rows <= int8_linear.FEW_ROWS)


@needs_kernel
def test_the_operation_from_threads_at_once_gives_each_the_product_chosen(monkeypatch):
    """Threads that call the operation at once, at shapes none has met (each one's first call
    handed to Python, which measures and tells the C++ kernel), all get int8_linear's numbers
    for the product the process keeps for the shape."""
    monkeypatch.delenv(int8_linear.PRODUCT_ENV, raising=False)
    cases = [operands(rows, 56, out, seed=rows + out) for rows in (1, 4, 8, 12) for out in (33, 70)]
    wrong = []

    def call(first):
        with torch.inference_mode():
            for i in range(3 * len(cases)):
                x, weight_t, scale, bias = cases[(first + i) % len(cases)]
                if not torch.equal(torch.ops.convs2s.int8_linear(x, weight_t, scale, bias),
                                   int8_linear.int8_linear(x, weight_t, scale, bias)):
                    wrong.append((first, i))

    threads = [threading.Thread(target=call, args=(first,)) for first in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads) and wrong == []


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("sentences, words, width, beam", [
    (1, 1, 3, 1),  # narrower than a vector
    (3, 7, 37, 5),  # a tail after the vectors
    (4, 9, 64, 12),  # a group of 8 hypotheses, then 4
    (128, 230, 256, 5),  # the benchmark's selection
])
def test_each_sentences_int8_rows_times_its_hypotheses_within_float32_rounding(sentences, words, width, beam,
                                                                               threads):
    """Vocabulary selection's own words in int8: each sentence's rows by its hypotheses alone,
    -inf where a sentence has no word (padding's bias), the sums within float32's rounding."""
    generator = torch.Generator().manual_seed(words)
    q = torch.randint(-127, 128, (sentences, words, width), generator=generator, dtype=torch.int8)
    scale = torch.rand(sentences, words, generator=generator) / 50
    bias = torch.randn(sentences, words, generator=generator)
    bias[0, -1] = float("-inf")
    h = torch.randn(sentences, beam, width, generator=generator) * 4
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = int8_linear.KERNEL.load().int8_rows_by_sentence(q, scale, bias, h)
    finally:
        torch.set_num_threads(previous)
    expected = int8_linear.int8_rows_by_sentence_torch(q, scale, bias, h)
    assert got.shape == (sentences, beam, words)
    assert got[0, :, -1].eq(float("-inf")).all()
    magnitude = torch.bmm(h.abs(), (q.abs().float() * scale.unsqueeze(2)).transpose(1, 2)) + bias.abs().unsqueeze(1)
    finite = expected.isfinite()
    assert ((got - expected).abs()[finite] <= 1e-6 * width * magnitude[finite]).all()
    strided = h.transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous: the function takes a copy
    assert torch.equal(int8_linear.int8_rows_by_sentence(q, scale, bias, strided),
                       int8_linear.int8_rows_by_sentence(q, scale, bias, h))


@needs_kernel
def test_int8_linear_writes_into_out_and_keeps_leading_dimensions():
    """As the layers call it: B x T x in, into W_o's reused logits or a new tensor."""
    x, weight_t, scale, bias = operands(12, 40, 30, seed=3)
    out = torch.empty(12, 30)
    got = int8_linear.int8_linear(x.view(3, 4, 40), weight_t, scale, bias, out=out, product="int_mm")
    assert got.shape == (3, 4, 30) and got.data_ptr() == out.data_ptr()
    assert torch.equal(got.view(12, 30), int8_linear.int8_linear_torch(x, weight_t, scale, bias))
    strided = x.t().contiguous().t()  # not contiguous: the kernel takes a copy
    assert torch.equal(int8_linear.int8_linear(strided, weight_t, scale, bias, product="int_mm"), got.view(12, 30))


def test_without_vectorized_code_torch_ops_do_the_work_with_a_warning():
    code = ("import logging; logging.basicConfig(); import torch\n"
            "from convs2s_serving import int8_linear as m\n"
            "x, w = torch.randn(4, 8), torch.randint(-127, 128, (5, 8), dtype=torch.int8).t()\n"
            "s, b = torch.rand(5), torch.randn(5)\n"
            "assert torch.equal(m.int8_linear(x, w, s, b, product='int_mm'), m.int8_linear_torch(x, w, s, b))\n"
            "print(m.KERNEL.load())")
    output = in_python(code, ATEN_CPU_CAPABILITY="default")
    assert "int8_linear kernel is not used (no build for torch's CPU capability DEFAULT)" in output
    assert output.split()[-1] == "None"


needs_fbgemm = pytest.mark.skipif(not int8_linear.fbgemm_available(), reason="this torch has no fbgemm")


@needs_fbgemm
@pytest.mark.parametrize("rows, width, out", [(1, 3, 2), (9, 37, 21), (640, 256, 512), (130, 256, 9792)])
def test_fbgemm_product_is_within_the_bound_of_its_7_bit_rows_and_writes_into_out(rows, width, out):
    """Each row divided by its largest |x| and quantized by fbgemm to 7 bits (one scale for
    [-1, 1], 2/127 a step), the sums exact, then multiplied back: within half a step of each
    row's and channel's scales of the float64 product of the int8 weights, an all-zero row
    giving the bias; into a caller's tensor, and with leading dimensions, as the layers call it."""
    x, weight_t, scale, bias = operands(rows, width, out, seed=4)
    x[0] = 0
    w = weight_t.t().double() * scale.double()[:, None]
    exact = x.double() @ w.t() + bias.double()
    target = torch.full((rows, out), float("nan"))
    got = int8_linear.int8_linear(x[None], weight_t, scale, bias, out=target, product="fbgemm")
    assert got.shape == (1, rows, out) and got.data_ptr() == target.data_ptr()
    r = x.abs().amax(1, keepdim=True).double()
    bound = (1 / 127) * r * w.abs().sum(1) + 1e-5 * (x.abs().double() @ w.abs().t() + bias.abs().double())
    assert ((got[0].double() - exact).abs() <= bound).all()
    assert torch.equal(got[0, 0], bias)
    assert torch.equal(int8_linear.int8_linear(x, weight_t, scale, bias, product="fbgemm"), got[0])


@needs_fbgemm
def test_fbgemm_packs_a_tensor_of_weights_once_and_again_when_it_changes():
    """A layer's weights are packed on their first product and kept while they live; weights
    changed in place (or their scales) are packed again, so no product reads stale weights."""
    x, weight_t, scale, bias = operands(8, 64, 48, seed=5)
    owner = weight_t._base
    first = int8_linear._packed(weight_t, scale)
    assert int8_linear._packed(owner.t(), scale) is first  # another view of the same weights
    before = int8_linear.int8_linear(x, weight_t, scale, bias, product="fbgemm")
    owner.neg_()
    assert int8_linear._packed(weight_t, scale) is not first
    after = int8_linear.int8_linear(x, weight_t, scale, bias, product="fbgemm")
    torch.testing.assert_close(after - bias, -(before - bias))
    scale.mul_(2)
    torch.testing.assert_close(int8_linear.int8_linear(x, weight_t, scale, bias, product="fbgemm") - bias,
                               2 * (after - bias))
    entries = [k for k in int8_linear._PACKED if k[2] == (64, 48)]
    del owner, weight_t, first
    assert all(int8_linear._PACKED[k][0].expired() for k in entries)
    int8_linear._packed(*operands(8, 32, 16, seed=6)[1:3])  # packing others drops the dead weights' copies
    assert not any(k in int8_linear._PACKED for k in entries)


@needs_fbgemm
def test_fbgemm_packs_inference_tensors_and_weights_sharing_memory():
    """Weights made under ``torch.inference_mode`` (no version counter), handed over as new
    tensors at every call, some of them in one memory as a compiled program's constants are:
    each is packed once and multiplied as its own (before, an inference tensor's product
    failed: "Inference tensors do not track version counter")."""
    x, weight_t, scale, bias = operands(8, 64, 48, seed=7)
    _, other_t, other_scale, other_bias = operands(8, 64, 48, seed=8)
    expected = [int8_linear.int8_linear(x, w, s, b, product="fbgemm")
                for w, s, b in ((weight_t, scale, bias), (other_t, other_scale, other_bias))]
    with torch.inference_mode():
        blob = torch.cat([weight_t.t().reshape(-1), other_t.t().reshape(-1)])  # one storage, both layers
        layers = [(blob[i * 48 * 64:(i + 1) * 48 * 64].view(48, 64).t(), s.clone(), b.clone())
                  for i, (s, b) in enumerate(((scale, bias), (other_scale, other_bias)))]
        for _ in range(2):
            for (w, s, b), want in zip(layers, expected):
                fresh = torch.as_strided(blob, w.shape, w.stride(), w.storage_offset())  # a new tensor each call
                assert torch.equal(int8_linear.int8_linear(x, fresh, s, b, product="fbgemm"), want)
        packed = [int8_linear._packed(torch.as_strided(blob, w.shape, w.stride(), w.storage_offset()), s)
                  for w, s, _ in layers]
        assert packed[0] is not packed[1]
        assert int8_linear._packed(torch.as_strided(blob, (64, 48), (1, 64), 0), layers[0][1]) is packed[0]


def chosen(env):
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "from convs2s_serving import int8_linear as m\n"
            "print(m.chosen_product(), m.weight_levels())")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, timeout=300,
                          env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_the_product_is_measured_logged_and_can_be_pinned():
    """Unpinned, the product is measured: fbgemm where torch._int_mm took over PRODUCT_MARGIN
    times its time, with the figures logged; CONVS2S_INT8_PRODUCT pins it, and a value this
    torch lacks is refused."""
    env = {k: v for k, v in os.environ.items() if k != int8_linear.PRODUCT_ENV}
    proc = subprocess.run([sys.executable, "-c", "import logging, sys; "
                           "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
                           "from convs2s_serving import int8_linear as m\n"
                           "f = m.probe_products()\n"
                           "print(m.chosen_product(), f['int_mm'] / f['fbgemm'], m.weight_levels())"],
                          cwd=ROOT, text=True, timeout=300, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    logged = re.search(r"int8 products: (\w+) \(128 x 512 -> 2048: torch._int_mm ([\d.]+) ms, fbgemm ([\d.]+) ms",
                       proc.stdout)
    product, ratio, levels = proc.stdout.split()[-3:]
    if int8_linear.fbgemm_available():
        assert logged and logged.group(1) == product, proc.stdout
        if float(ratio) > 3 * int8_linear.PRODUCT_MARGIN:  # far from the margin: not a close call
            assert product == "fbgemm" and levels == "127"
        elif float(ratio) < int8_linear.PRODUCT_MARGIN / 3:
            assert product == "int_mm"
    for pinned in ("int_mm", "fbgemm"):
        proc = chosen({int8_linear.PRODUCT_ENV: pinned})
        if pinned == "fbgemm" and not int8_linear.fbgemm_available():
            continue
        assert proc.returncode == 0 and proc.stdout.split()[-2] == pinned, proc.stdout[-3000:]
        assert "int8 products:" not in proc.stdout  # pinned: nothing measured
    proc = chosen({int8_linear.PRODUCT_ENV: "vnni"})
    assert proc.returncode != 0 and "CONVS2S_INT8_PRODUCT='vnni': this torch has int_mm" in proc.stdout


def test_weights_of_more_levels_than_the_measured_product_sums_take_fbgemm_unless_pinned():
    """An export's 8-bit weights (127 levels) where torch._int_mm sums up to 63 (oneDNN held to
    AVX2): unpinned, the process takes fbgemm, which sums them exactly, whichever product it
    measured the faster (the two measure close there, and an export made where fbgemm won was
    refused where torch._int_mm did); pinned to torch._int_mm, it stays, and the sums are not
    exact (the export is refused)."""
    code = ("from convs2s_serving import int8_linear as m\n"
            "m.take_product_for_levels(127)\n"
            "print(m.int_mm_levels(), m.chosen_product(), m.weight_levels())")
    held = {k: v for k, v in os.environ.items() if k != int8_linear.PRODUCT_ENV}
    held["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    for pinned in (None, "int_mm"):
        env = held if pinned is None else {**held, int8_linear.PRODUCT_ENV: pinned}
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, timeout=300, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.returncode == 0, proc.stdout[-3000:]
        int_mm_levels, product, levels = proc.stdout.split()[-3:]
        if pinned:
            assert product == "int_mm" and levels == int_mm_levels
        elif int8_linear.fbgemm_available():
            assert levels == "127" and (product == "fbgemm" or int_mm_levels == "127"), proc.stdout

