"""Safe parsing of layer specifications such as ``[(512, 3)] * 10 + [(768, 3)] * 3``.

fairseq's ``fconv`` passes these strings to ``eval``; here they are parsed as Python
literals extended with ``+`` (concatenation) and ``*`` (repetition), and nothing else, so a
command line or a checkpoint cannot run code. The same grammar reads the per-layer
attention flags (``True``, or a list such as ``[True, False, True]``).
"""
import ast


def _evaluate(node, text):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_evaluate(e, text) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _evaluate(node.left, text), _evaluate(node.right, text)
        return left + right if isinstance(node.op, ast.Add) else left * right
    raise ValueError(
        f"cannot parse layer specification {text!r}: only lists and tuples of integers "
        "and booleans, joined with + and repeated with *, are allowed, "
        "for example '[(512, 3)] * 10 + [(768, 3)] * 3'"
    )


def parse_spec(text):
    """Parse a spec string; values that are already parsed pass through."""
    if not isinstance(text, str):
        return text
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"cannot parse layer specification {text!r}: {e.msg}") from None
    return _evaluate(tree.body, text)


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
