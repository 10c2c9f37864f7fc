"""Safe parsing of layer specifications such as ``[(512, 3)] * 10 + [(768, 3)] * 3``.

fairseq's ``fconv`` passes these strings to ``eval``; here they are read by an allow-list
grammar (:func:`literal`): Python literals (numbers, strings, ``None``, lists, tuples, dicts),
``+`` between lists or tuples, and ``*`` of a list or tuple by an integer literal, with the
expanded value bounded in size before anything is built. Nothing else is accepted, so a
command line or a checkpoint can neither run code nor allocate without bound. The same
grammar reads the per-layer attention flags (``True``, or a list such as ``[True, False]``)
and the strings of a checkpoint's configuration that fairseq evaluates
(:mod:`fairseq_convs2s_ext.checkpoints.safe_loading`).
"""
import ast

# The most values (numbers, strings, ...) an expanded literal may hold: the deepest paper
# architecture has 20 + 20 layers of two numbers each.
MAX_VALUES = 10_000
# The longest text parsed at all: ast.parse's own memory grows with it.
MAX_TEXT = 100_000
_CONSTANTS = (int, float, bool, str, type(None))
_SEQUENCES = (ast.List, ast.Tuple)


def _number(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _count(node, text) -> int:
    """How many values ``node`` expands to, found before it is built; ValueError outside the grammar."""
    if isinstance(node, ast.Constant) and type(node.value) in _CONSTANTS:
        return 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and _number(node.operand):
        return 1
    if isinstance(node, _SEQUENCES):
        return sum(_count(e, text) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:  # {**x} has a None key
        return sum(_count(e, text) for e in node.keys + node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        if not (_sequence(node.left) and _sequence(node.right)):
            raise ValueError("+ joins lists or tuples only")
        return _count(node.left, text) + _count(node.right, text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        sequence, times = (node.left, node.right) if _sequence(node.left) else (node.right, node.left)
        if not _sequence(sequence) or not (isinstance(times, ast.Constant) and type(times.value) is int):
            raise ValueError("* repeats a list or tuple by an integer literal only")
        return _count(sequence, text) * times.value
    raise ValueError(f"{ast.unparse(node)!r} is not a literal")


def _sequence(node) -> bool:
    """A list or tuple, or a sum or repetition of them."""
    if isinstance(node, _SEQUENCES):
        return True
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)) and (
        _sequence(node.left) or _sequence(node.right))


def _build(node):
    if isinstance(node, ast.BinOp):
        left, right = _build(node.left), _build(node.right)
        return left + right if isinstance(node.op, ast.Add) else left * right
    if isinstance(node, _SEQUENCES):
        items = [_build(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Dict):
        return {_build(k): _build(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)  # a constant, or a signed number


def literal(text: str):
    """The value of ``text`` in the grammar above, or ValueError saying why it is not one."""
    if len(text) > MAX_TEXT:
        raise ValueError(f"{len(text)} characters long")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"not a Python literal ({type(e).__name__})") from None
    try:
        values = _count(tree.body, text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as e:
        whole = f"{ast.unparse(tree.body)!r} is not a literal"
        raise ValueError("not a literal" if str(e) == whole else str(e)) from None
    if values > MAX_VALUES:
        raise ValueError(f"expands to {values:,} values, more than the {MAX_VALUES:,} a specification may hold")
    try:
        return _build(tree.body)
    except TypeError as e:  # a list as a dict key
        raise ValueError(str(e)) from None


def parse_spec(text):
    """Parse a spec string of integers and booleans; values that are already parsed pass through."""
    if not isinstance(text, str):
        return text
    try:
        value = literal(text)
        _integers_and_booleans(value)
    except ValueError as e:
        raise ValueError(
            f"cannot parse layer specification {text!r} ({e}): only lists and tuples of integers "
            "and booleans, joined with + and repeated with * by an integer, are allowed, "
            "for example '[(512, 3)] * 10 + [(768, 3)] * 3'"
        ) from None
    return value


def _integers_and_booleans(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            _integers_and_booleans(item)
    elif type(value) not in (int, bool):
        raise ValueError(f"{value!r} is not an integer or boolean")


def parse_layers(text):
    """A list of (out_channels, kernel_width) pairs.

    A third element (fconv's residual distance) must be 1: a residual connection to the
    previous layer, which is what the paper and every fconv architecture use.
    """
    layers = parse_spec(text)
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"layer specification {text!r} must be a non-empty list of (channels, kernel_width)")
    parsed = []
    for layer in layers:
        if not isinstance(layer, tuple) or len(layer) not in (2, 3) or (len(layer) == 3 and layer[2] != 1):
            raise ValueError(
                f"layer {layer!r} in {text!r} must be (channels, kernel_width); "
                "residual connections other than to the previous layer are not supported"
            )
        channels, kernel_width = layer[:2]
        if channels < 1 or kernel_width < 1:
            raise ValueError(f"layer {layer!r} in {text!r} needs positive channels and kernel width")
        parsed.append((channels, kernel_width))
    return parsed


def parse_attention(text, num_layers):
    """One boolean per decoder layer: which layers have their own attention (table 5)."""
    spec = parse_spec(text)
    if isinstance(spec, bool):
        return [spec] * num_layers
    if not isinstance(spec, list) or len(spec) != num_layers or not all(isinstance(a, bool) for a in spec):
        raise ValueError(
            f"decoder attention {text!r} must be True, False or a list of {num_layers} booleans "
            "(one per decoder layer)"
        )
    return spec
