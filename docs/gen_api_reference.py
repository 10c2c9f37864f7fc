"""The options tables of the API reference, generated at build time from the config dataclasses.

A MkDocs hook (``hooks:`` in mkdocs.yml). fairseq turns each field of a model's, task's or
criterion's config dataclass into a command-line option (``encoder_layers`` becomes
``--encoder-layers``) and a hydra key (``model.encoder_layers``), with the field's
``metadata["help"]`` as its help. mkdocstrings renders docstrings, not that metadata, so a
page names a dataclass in a marker line::

    <!-- config-options: fairseq_convs2s_ext.models.convs2s.ConvS2SConfig model -->

and the hook puts in its place a table of every field: option, hydra key, default, help. The
fields come from the class itself, so the table cannot drift from the code; a marker naming
no dataclass stops the build. ``inherited`` after the group also lists the fields the class
inherits (fairseq's translation task's, say) in a second table.
"""
import dataclasses
import importlib
import re
import warnings

MARKER = re.compile(r"^<!-- config-options: (?P<target>[\w.]+) (?P<group>\w+)(?P<inherited> inherited)? -->$", re.M)


def load(target):
    module, name = target.rsplit(".", 1)
    with warnings.catch_warnings():  # fairseq's import-time deprecations are not the reader's concern
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = getattr(importlib.import_module(module), name)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{target} is not a dataclass")
    return cls


def default(field):
    """The default as a reader passes it: a copy of another option is named as that option."""
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    elif field.default is dataclasses.MISSING:
        return "required"
    else:
        value = field.default
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return f"the value of `{value[2:-1]}`"
    if value is None:
        return "none"
    if hasattr(value, "value"):  # fairseq's ChoiceEnum members
        value = value.value
    return f"`{value}`"


def cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def rows(fields, group):
    for field in fields:
        if field.name.startswith("_"):  # fairseq's registry name, not an option
            continue
        source = field.default[2:-1] if isinstance(field.default, str) and field.default.startswith("${") else None
        # fairseq's command line: every field an option of its name, except `data`, the positional argument
        name = source.split(".")[-1] if source else field.name
        option = "DATA (the first argument)" if name == "data" else "--" + name.replace("_", "-")
        help = f"set with `{option}` (`{source}`)" if source else field.metadata.get("help", "")
        yield f"| `{option}` | `{group}.{field.name}` | {cell(default(field))} | {cell(help)} |"


def table(cls, group, fields):
    header = "| option | hydra key | default | help |\n|---|---|---|---|\n"
    return header + "\n".join(rows(fields, group)) + "\n"


def options_markdown(target, group, inherited=False):
    """The tables that replace one marker."""
    cls = load(target)
    own_names = set(vars(cls).get("__annotations__", {}))
    fields = dataclasses.fields(cls)
    own = [f for f in fields if f.name in own_names]
    text = f"**Options of `{cls.__name__}`** (command line, or hydra's `{group}.` keys):\n\n" + table(cls, group, own)
    if inherited:
        base = [f for f in fields if f.name not in own_names]
        parents = ", ".join(f"`{b.__module__}.{b.__name__}`" for b in cls.__mro__[1:2])
        text += f"\n**Inherited from {parents}:**\n\n" + table(cls, group, base)
    return text


def on_page_markdown(markdown, page, config, files):
    """MkDocs hook: each ``config-options`` marker becomes its options tables."""
    from mkdocs.exceptions import PluginError

    def replace(match):
        try:
            return options_markdown(match["target"], match["group"], bool(match["inherited"]))
        except Exception as error:  # noqa: BLE001  (any failure names the marker and stops the build)
            raise PluginError(f"API reference: {page.file.src_uri}: {match.group(0)}: {error}") from error

    return MARKER.sub(replace, markdown)


if __name__ == "__main__":
    import sys

    print(options_markdown(*sys.argv[1:3], inherited="--inherited" in sys.argv))
