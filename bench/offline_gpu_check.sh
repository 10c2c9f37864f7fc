#!/usr/bin/env bash
# `make gpu-check` on a GPU machine that reaches no package index but has Python 3.12 and a
# CUDA torch (with numpy, pytest, pytest-timeout, sacrebleu, scikit-learn, matplotlib, ninja).
#
#   bash bench/offline_gpu_check.sh pack          # here, online: wheels and data into .offline/
#   bash bench/offline_gpu_check.sh check OUT     # there, from the checkout with .offline/ beside it
#
# pack builds Python 3.12 wheels of what such a machine lacks: fairseq-fixed with its Cython
# extensions but without its torch C++ ones (libnat, libbase: non-autoregressive models and
# BASE layers, which ConvS2S does not use; its setup.py imports torch, so it is built from the
# sdist with that import removed), hydra-core, omegaconf, antlr4, bitarray, subword-nmt, mock,
# sacremoses, tensorboardX and this package; and copies the data folder (CONVS2S_DATA) and the
# benchmark's prepared demo data. check installs them into a folder on PYTHONPATH, runs the
# CUDA tests (each bounded, so the summary with the failures is always printed) and
# bench.gpu, writing logs and JSON into OUT as each part ends.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
pack="$here/.offline"

case "${1:-}" in
pack)
    py312=${PY312:-python3.12}
    rm -rf "$pack" && mkdir -p "$pack/wheels" "$pack/cache/convs2s-bench"
    build=$(mktemp -d) && trap 'rm -rf "$build"' EXIT
    "$py312" -m venv "$build/venv" && "$build/venv/bin/pip" install -q cython numpy setuptools wheel
    "$build/venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$pack/wheels" hydra-core==1.3.2 omegaconf==2.3.0 bitarray subword-nmt mock sacremoses tensorboardX
    "$build/venv/bin/pip" wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$pack/wheels"
    "$build/venv/bin/python" - "$build" <<'PY'  # the sdist: pip download runs its setup.py, which imports torch
import re, sys, tarfile, urllib.request
index = urllib.request.urlopen("https://pypi.org/simple/fairseq-fixed/").read().decode()
sdist = re.search(r'href="(https://[^"#]*/fairseq_fixed-0\.12\.3\.1\.tar\.gz)', index).group(1)
tarfile.open(urllib.request.urlretrieve(sdist)[0]).extractall(sys.argv[1], filter="data")
PY
    "$build/venv/bin/python" - "$build/fairseq_fixed-0.12.3.1/setup.py" <<'PY'
import re, sys
path = sys.argv[1]
setup = open(path).read().replace("from torch.utils import cpp_extension\n", "")
setup = re.sub(r"extensions\.extend\(\n    \[\n        cpp_extension.*?\ncmdclass = \{[^}]*\}", "cmdclass = {}", setup, flags=re.S)
assert "cpp_extension" not in setup, "fairseq's setup.py changed: remove its torch extensions by hand"
open(path, "w").write(setup)
PY
    "$build/venv/bin/pip" wheel -q --no-deps --no-build-isolation "$build/fairseq_fixed-0.12.3.1" -w "$pack/wheels"
    "$build/venv/bin/pip" wheel -q --no-deps --no-build-isolation "$here" -w "$pack/wheels"
    data=$(cd "$here" && "${PYTHON:-$here/.venv/bin/python}" -c "from convs2s_recipes.corpora import data_root; print(data_root())")
    cp -r "$data" "$pack/data"
    prepared=$(cd "$here" && "${PYTHON:-$here/.venv/bin/python}" -m bench.data)  # .../multi30k-demo/prepared/bin
    mkdir -p "$pack/cache/convs2s-bench/multi30k-demo"
    cp -r "$(dirname "$(dirname "$prepared")")"/{prepared,raw} "$pack/cache/convs2s-bench/multi30k-demo/"
    du -sh "$pack"
    ;;
check)
    out=${2:?usage: $0 check OUT}
    mkdir -p "$out" && cd "$here"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
    lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$out/machine.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/convs2s-site "$pack"/wheels/*.whl
    export PYTHONPATH=/tmp/convs2s-site PYTHONUNBUFFERED=1 CONVS2S_DATA="$pack/data" XDG_CACHE_HOME="$pack/cache"
    python3 -m pytest -q -p no:cacheprovider -m cuda --timeout "${TEST_TIMEOUT:-240}" -rfE tests/test_cuda.py 2>&1 \
        | tee "$out/cuda-tests.log" || true
    # shellcheck disable=SC2086
    python3 -m bench.gpu ${GPU_ARGS:-} --json "$out/gpu.json" --logs "$out/logs" 2>&1 | grep -v " | INFO | " | tee "$out/gpu.log"
    ;;
*)
    sed -n 2,7p "$0" >&2
    exit 2
    ;;
esac
