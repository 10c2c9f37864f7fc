"""Loading an exported folder without letting it run code.

``torch.export.load`` is not safe on a file from elsewhere: it unpickles a payload marked
``use_pickle`` (and a sample-input file whose safe load fails) with ``weights_only=False``,
hands each symbolic shape expression to ``sympy.sympify`` (an ``eval``), ``exec``s the
program's guards as Python source, and resolves each node's target by name anywhere under
``torch``, ``operator`` and ``math`` (``torch.load`` included). So before torch reads a
``.pt2`` file, :func:`check_archive` checks it against an allow-list of what
``convs2s-export`` writes, and refuses anything else in one line naming the file:

- the archive's entries: the program's JSON, its weights as raw tensor bytes and their
  configuration, an empty constants table, the sample inputs, and torch's version files;
- no weight stored as a pickle, no constant at all, sample inputs that torch's
  ``weights_only`` unpickler reads (so torch never falls back to the unsafe one);
- every node's target among :data:`ALLOWED_TARGETS`, the tensor operations the exporter's
  programs use; inputs that are the user's, parameters or buffers, and no custom objects;
- every shape expression a call tree of sympy's arithmetic (:data:`SYMPY_FUNCTIONS`) over
  integers and size symbols, and every guard a comparison of input sizes and integers, both
  read with Python's parser, never evaluated here.
"""
import ast
import hashlib
import io
import json
import re
import warnings
import zipfile
from typing import NamedTuple, Optional

import torch

ALLOWED_TARGETS = frozenset({
    "_operator.add", "_operator.sub", "_operator.mul", "_operator.floordiv", "_operator.mod",
    *(f"torch.ops.aten.{op}" for op in (
        "_assert_tensor_metadata.default", "add.Tensor", "alias.default", "baddbmm.default", "baddbmm_.default",
        "bitwise_not.default", "bmm.default", "cat.default", "contiguous.default", "cumsum.default",
        "embedding.default", "eq.Scalar", "expand.default", "flatten.using_ints", "glu.default",
        "index_select.default", "linear.default", "log_softmax.int", "masked_fill.Scalar", "masked_fill_.Scalar",
        "matmul.default", "mul.Scalar", "mul.Tensor", "mul_.Tensor", "ne.Scalar", "pad.default", "permute.default",
        "reshape.default", "rsqrt.default", "select.int", "slice.Tensor", "softmax.int", "sum.dim_IntList",
        "sym_size.int", "to.dtype", "transpose.int", "type_as.default", "unfold.default", "unsqueeze.default",
        "view.default",
    )),
    "torch.ops.convs2s.int8_linear.default",  # int8 (convs2s-export --quantize int8): convs2s_serving.int8_linear
})
SYMPY_FUNCTIONS = frozenset({"Add", "Mul", "Min", "Max", "Mod", "PythonMod", "FloorDiv", "CleanDiv", "CeilToInt",
                             "FloorToInt", "TruncToInt", "Integer", "Symbol", "Pow"})
SYMBOL = re.compile(r"[su]\d+")
SYMBOL_ASSUMPTIONS = frozenset({"positive", "integer", "nonnegative"})
ENTRY = re.compile(
    r"[A-Za-z_]\w*/("
    r"data/weights/(weight_\d+|model_weights_config\.json)|data/constants/model_constants_config\.json"
    r"|models/model\.json|data/sample_inputs/model\.pt|archive_format|archive_version|byteorder"
    r"|\.data/version|\.data/serialization_id)"
)
INPUT_KINDS = frozenset({"user_input", "parameter", "buffer"})


class UnsafeArchive(ValueError):
    """An archive holding something ``convs2s-export`` does not write."""


class CheckedProgram(NamedTuple):
    """A ``torch.export`` program and the SHA-256 of the archive's bytes it was loaded from."""
    program: "torch.export.ExportedProgram"
    sha256: str


def load_exported(path: str) -> CheckedProgram:
    """The ``torch.export`` program of the ``.pt2`` file ``path``, after :func:`check_archive`.
    The file is read once: torch loads the bytes that were checked (and that are hashed), so
    a file replaced or rewritten after its check is not what runs. It is held in memory while
    torch loads it (the programs, not W_o, which ``output.pt`` holds)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UnsafeArchive(f"{path}: not a torch.export archive ({e})") from None
    check_archive(path, data)
    from . import int8_linear  # noqa: F401 (registers torch.ops.convs2s.int8_linear, which int8 programs call)

    return CheckedProgram(torch.export.load(io.BytesIO(data)), hashlib.sha256(data).hexdigest())


def load_tensors(path: str, expected) -> dict:
    """The tensors of a file ``torch.save`` wrote (``output.pt``), read by torch's
    ``weights_only`` unpickler (tensors and plain containers: it refuses anything else, and
    is never retried with the unsafe one), which must be a dict of exactly the ``expected``
    names, each with its dtype and number of dimensions: ``{name: (dtype, dims)}``."""
    try:
        with warnings.catch_warnings():  # torch's remarks on a foreign pickle: the refusal says it
            warnings.simplefilter("ignore")
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing: export the model again with convs2s-export") from None
    except Exception as e:
        _refuse(path, f"what torch's safe unpickler refuses ({type(e).__name__})")
    if not isinstance(tensors, dict) or set(tensors) != set(expected):
        names = sorted(tensors) if isinstance(tensors, dict) else type(tensors).__name__
        raise ValueError(f"{path}: holds {names}, not the {sorted(expected)} convs2s-export writes: "
                         "export the model again")
    for name, (dtype, dims) in expected.items():
        tensor = tensors[name]
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tensor.dim() != dims:
            raise ValueError(f"{path}: {name} is not a {dims}-D {dtype} tensor: export the model again")
    return tensors


def check_archive(path: str, data: Optional[bytes] = None) -> None:
    """Raise :class:`UnsafeArchive` unless ``path`` (or ``data``, its bytes read by the caller,
    ``path`` then naming them) holds only what the module's docstring allows."""
    try:
        archive = zipfile.ZipFile(path if data is None else io.BytesIO(data))
    except (zipfile.BadZipFile, OSError) as e:
        raise UnsafeArchive(f"{path}: not a torch.export archive ({e})") from None
    with archive:
        for name in archive.namelist():
            if not ENTRY.fullmatch(name):
                _refuse(path, f"an entry convs2s-export does not write ({name})")
            if name.endswith("model_weights_config.json"):
                for fqn, weight in json.loads(archive.read(name))["config"].items():
                    if weight.get("use_pickle") is not False:
                        _refuse(path, f"weight {fqn} is stored as a pickle")
            elif name.endswith("model_constants_config.json"):
                if json.loads(archive.read(name)).get("config") != {}:
                    _refuse(path, "constants (convs2s-export writes none)")
            elif name.endswith("sample_inputs/model.pt"):
                try:
                    with warnings.catch_warnings():  # torch's remarks on a foreign pickle: the refusal says it
                        warnings.simplefilter("ignore")
                        torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as e:  # torch would retry with the unsafe unpickler
                    _refuse(path, f"sample inputs that torch's safe unpickler refuses ({type(e).__name__})")
            elif name.endswith("models/model.json"):
                _check_program(path, json.loads(archive.read(name)))


def _check_program(path, program):
    module = program["graph_module"]
    graph = module["graph"]
    for node in graph["nodes"]:
        if node.get("target") not in ALLOWED_TARGETS:
            _refuse(path, f"an operation convs2s-export does not use ({str(node.get('target'))[:80]})")
    if graph.get("custom_obj_values"):
        _refuse(path, "custom objects")
    for spec in module["signature"]["input_specs"]:
        if set(spec) - INPUT_KINDS:
            _refuse(path, f"an input of kind {sorted(set(spec) - INPUT_KINDS)[0]}")
    for spec in module["signature"]["output_specs"]:
        if set(spec) != {"user_output"}:
            _refuse(path, f"an output of kind {sorted(spec)[0]}")
    for expression in _values(program, "expr_str"):
        if not _is_sympy_arithmetic(expression):
            _refuse(path, f"a shape expression that is not arithmetic ({str(expression)[:80]})")
    for guard in program.get("guards_code", []):
        if not _is_size_guard(guard):
            _refuse(path, f"a guard that is not a comparison of sizes ({str(guard)[:80]})")


def _values(tree, key):
    """Every value stored under ``key`` anywhere in the JSON ``tree``."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            if k == key:
                yield v
            else:
                yield from _values(v, key)
    elif isinstance(tree, list):
        for v in tree:
            yield from _values(v, key)


def _parsed(text):
    if not isinstance(text, str):
        return None
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None


def _is_sympy_arithmetic(text) -> bool:
    """``Mul(Integer(256), Symbol('s17', positive=True, integer=True))`` and the like."""
    def allowed(node):
        if isinstance(node, ast.Constant):
            return type(node.value) is int
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return allowed(node.operand)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SYMPY_FUNCTIONS):
            return False
        if node.func.id == "Symbol":
            return (len(node.args) == 1 and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and bool(SYMBOL.fullmatch(node.args[0].value))
                    and all(k.arg in SYMBOL_ASSUMPTIONS and isinstance(k.value, ast.Constant)
                            and type(k.value.value) is bool for k in node.keywords))
        return not node.keywords and all(map(allowed, node.args))

    node = _parsed(text)
    return node is not None and allowed(node)


def _is_size_guard(text) -> bool:
    """``L['tokens'].size()[0] == L['windows'][0].size()[0]`` and the like: sizes of the
    inputs, integers, arithmetic, comparisons, and/or/not."""
    arithmetic = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
    comparisons = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)

    def an_input(node):  # L['name'] or L['name'][i]
        if isinstance(node, ast.Name):
            return node.id == "L"
        return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and type(node.slice.value) in (int, str) and an_input(node.value))

    def allowed(node):
        if isinstance(node, ast.Constant):
            return type(node.value) is int
        if isinstance(node, ast.BoolOp):
            return all(map(allowed, node.values))
        if isinstance(node, ast.UnaryOp):
            return isinstance(node.op, (ast.Not, ast.USub)) and allowed(node.operand)
        if isinstance(node, ast.BinOp):
            return isinstance(node.op, arithmetic) and allowed(node.left) and allowed(node.right)
        if isinstance(node, ast.Compare):
            return all(isinstance(op, comparisons) for op in node.ops) and all(map(allowed, [node.left, *node.comparators]))
        if isinstance(node, ast.Subscript):  # X.size()[i]
            call = node.value
            return (isinstance(node.slice, ast.Constant) and type(node.slice.value) is int
                    and isinstance(call, ast.Call) and not call.args and not call.keywords
                    and isinstance(call.func, ast.Attribute) and call.func.attr == "size" and an_input(call.func.value)
                    and not isinstance(call.func.value, ast.Name))
        return False

    node = _parsed(text)
    return node is not None and allowed(node)


def _refuse(path, what):
    raise UnsafeArchive(f"{path}: holds {what}: not loaded (it could run code); export the model again "
                        "with convs2s-export, or load only folders you exported")
