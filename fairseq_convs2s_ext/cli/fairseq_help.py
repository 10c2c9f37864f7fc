"""``fairseq-train --user-dir ... --help --task convs2s_translation --arch convs2s_wmt_en_ro``:
the help with the task's, the architecture's and the chosen components' options.

fairseq's ``options.parse_args_and_arch`` parses the command line twice: first with the
command's general options only, to learn ``--task``, ``--arch``, ``--criterion``, ...; then,
after adding their options, again. Its parser answers ``--help`` on the first parse, before
any of those options exist, so ``--help`` never shows ``--vocab-selection`` or
``--encoder-layers`` (nor, for fairseq's own ``--arch fconv``, ``--encoder-layers``).

fairseq offers a plugin no hook between its two parses; the one hook that runs before them
is the import of ``--user-dir``, which happens while the command builds its parser. So when
the plugin is imported by one of these commands with ``-h``/``--help`` on its command line,
:func:`print_complete_help` builds the command's parser with fairseq's own functions, adds
the options exactly as the second parse would (the same registries and ``add_args``), prints
the help and exits, as argparse does for ``--help``.

The same parse answers a mistyped ``--arch`` or ``--task`` (:func:`refuse_unknown_choices`):
fairseq's parser would print its whole usage and every name it has (hundreds of
architectures); here, argparse's error line with the registered names closest to the one
given, as a spelling checker would (``did you mean convs2s_iwslt_de_en?``).
"""
import argparse
import difflib
import os
import sys

from ..command import fairseq_command

# fairseq command (fairseq_cli module) -> the fairseq.options function that builds its parser.
PARSERS = {
    "train": "get_training_parser",
    "generate": "get_generation_parser",
    "interactive": "get_interactive_generation_parser",
    "validate": "get_validation_parser",
    "eval_lm": "get_eval_lm_parser",
}


def asks_for_help(argv) -> bool:
    return "-h" in argv or "--help" in argv


def complete_parser(command: str, argv) -> argparse.ArgumentParser:
    """The parser fairseq's second parse uses for ``argv``: the command's options, then those of
    its architecture, task and components (criterion, optimizer, ...)."""
    from fairseq import options
    from fairseq.dataclass.utils import gen_parser_from_dataclass
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    parser = getattr(options, PARSERS[command])()
    chosen = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # the first parse, without --help
    for name in ("task", "arch", *REGISTRIES):
        flags = ["--" + name.replace("_", "-")] + (["-a"] if name == "arch" else [])
        chosen.add_argument(*flags, dest=name, default=parser.get_default(name))
    args, _ = chosen.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    if args.arch is not None:
        group = parser.add_argument_group("Model-specific configuration", argument_default=argparse.SUPPRESS)
        model = ARCH_MODEL_REGISTRY.get(args.arch) or MODEL_REGISTRY.get(args.arch)
        if model is not None:
            model.add_args(group)
    if args.task in TASK_REGISTRY:
        TASK_REGISTRY[args.task].add_args(parser)
    for name, registry in REGISTRIES.items():
        cls = registry["registry"].get(getattr(args, name))
        if cls is None:
            continue
        if hasattr(cls, "add_args"):
            cls.add_args(parser)
        elif hasattr(cls, "__dataclass"):
            gen_parser_from_dataclass(parser, cls.__dataclass())
    return parser


def closest(name: str, names) -> list:
    """Up to 3 of ``names`` closest to ``name``: first those of the same words between
    underscores in another order (``convs2s_iwslt_en_de`` for ``convs2s_iwslt_de_en``: a
    language pair swapped), then difflib's closest by spelling."""
    words = sorted(name.split("_"))
    reordered = [n for n in names if sorted(n.split("_")) == words]
    return (reordered + [n for n in difflib.get_close_matches(name, names, n=3) if n not in reordered])[:3]


def refuse_unknown_choices(command: str, argv) -> None:
    """A ``--task`` (or, in fairseq-train, ``--arch``) that fairseq has not registered: argparse's
    error line with the closest registered names, and exit 2 as argparse does."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    chosen = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    chosen.add_argument("--task")
    chosen.add_argument("--arch", "-a")
    args, _ = chosen.parse_known_args(argv)
    given = [("--task", args.task, TASK_REGISTRY)]
    if command == "train":  # the only command whose parser has --arch
        given.append(("--arch/-a", args.arch, ARCH_MODEL_REGISTRY))
    for flag, name, registry in given:
        if name is not None and name not in registry:
            close = closest(name, list(registry))
            others = f" (or {', '.join(close[1:])})" if close[1:] else ""
            hint = f"; did you mean {close[0]}{others}?" if close else f" (see {flag.split('/')[0]} in --help)"
            print(f"{os.path.basename(sys.argv[0])}: error: argument {flag}: invalid choice: {name!r}{hint}",
                  file=sys.stderr)
            sys.exit(2)


def print_complete_help(argv=None) -> None:
    """In a fairseq command: a mistyped ``--task`` or ``--arch`` is refused in one line
    (:func:`refuse_unknown_choices`); asked for ``--help``, print the complete help and exit 0."""
    argv = sys.argv[1:] if argv is None else argv
    command = fairseq_command()
    if command in PARSERS:
        refuse_unknown_choices(command, argv)
    if command in PARSERS and asks_for_help(argv):
        complete_parser(command, argv).print_help()
        sys.exit(0)
