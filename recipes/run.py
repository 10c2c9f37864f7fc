"""``convs2s-recipe NAME``: one of the paper's experiments end to end (section 4).

download -> prepare (tokenize, clean, BPE, binarize) -> train (fairseq-hydra-train's training with
the recipe's YAML, ``recipe/NAME.yaml`` in the installed config folder that ``convs2s-recipe
--config-dir`` prints, plus any ``key=value`` overrides) -> generate (beam 5, length-normalized
scores, every test sentence) -> score -> ``report.md`` and ``report.json`` in the work folder,
``./work/NAME`` in the folder the command runs in unless ``--work`` names another. A word-level recipe with ``replace_unk`` (``multi30k-unk``) also builds the alignment
dictionary and translates again with ``--replace-unk``, and reports both scores and the
replacements (see :mod:`convs2s_recipes.unknown_words`). Every step resumes: prepared files are kept,
fairseq resumes training from checkpoint_last.

``--smoke`` runs the same recipe with a tiny model and a few updates, to check the whole pipeline:
en-ro on small local data (RO-STS for training, newsdev2016 and newstest2016), multi30k-unk on
its own data.

Threads: the recipe chooses its thread count once (:mod:`fairseq_convs2s_ext.threads`:
``OMP_NUM_THREADS`` when set, else the idle cores), trains with it and hands it to the
fairseq commands it starts as ``OMP_NUM_THREADS``.
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional

from convs2s_preprocess.runtime.atomic import atomic_outputs
from convs2s_preprocess.stages.bpe import remove_bpe
from convs2s_preprocess.errors import PreprocessError, full_disk_reported
from convs2s_preprocess.runtime.locking import output_lock
from convs2s_preprocess.runtime.processes import run_child
from convs2s_preprocess.stages.romanian import normalize_romanian_line
from convs2s_preprocess.textio import read_lines

from . import corpora, score, unknown_words
from .download import DownloadError
from .settings import CONFIG_DIR, PrintConfigDir

# Imported where used, so that `convs2s-recipe --help` answers at once: convs2s_preprocess.pipeline
# and convs2s_preprocess.stages.tokenize (sacremoses), hydra, fairseq and the plugin.

logger = logging.getLogger("convs2s-recipe")


@dataclass(frozen=True)
class Recipe:
    experiment: str  # key of corpora.EXPERIMENTS
    config: str  # recipes/configs/recipe/CONFIG.yaml (built on recipes/configs/paper.yaml)
    bpe_merges: Optional[int] = 40000  # None: word level
    romanian: bool = False  # Sennrich's WMT16 Romanian normalization
    ratio: Optional[float] = 1.5  # source/target length ratio filter (None: off)
    nwords: int = -1
    metric: str = "bleu"  # "bleu" (detokenized sacreBLEU), "tokenized-bleu" (and sacreBLEU), "rouge"
    max_len_a: float = 0.0  # generation length limit: a * source length + b
    max_len_b: int = 200
    joined_dictionary: bool = True  # False: a dictionary a language, each of nwords words
    replace_unk: bool = False  # also translate with --replace-unk and an alignment dictionary


RECIPES = {
    "wmt16-en-ro": Recipe("wmt16-en-ro", "wmt16_en_ro", romanian=True),
    "wmt14-en-de": Recipe("wmt14-en-de", "wmt14_en_de", metric="tokenized-bleu"),
    "wmt14-en-fr": Recipe("wmt14-en-fr", "wmt14_en_fr", metric="tokenized-bleu"),
    "gigaword": Recipe("gigaword", "gigaword", bpe_merges=None, ratio=None, nwords=30000, metric="rouge"),
    "multi30k-demo": Recipe("multi30k-en-de", "multi30k_demo", bpe_merges=10000, max_len_a=1.5, max_len_b=10),
    # Unknown-word replacement (section 4, word-based models): the demo's model at word level,
    # 4000 words a side, scored without and with --replace-unk.
    "multi30k-unk": Recipe("multi30k-en-de", "multi30k_unk", bpe_merges=None, nwords=4000, joined_dictionary=False,
                           max_len_a=1.5, max_len_b=10, replace_unk=True),
}
# An untrained tiny model rarely ends a sentence: cap its output at 30 tokens.
SMOKE = {"wmt16-en-ro": dict(experiment="wmt16-en-ro-smoke", bpe_merges=2000, max_len_b=30), "multi30k-unk": {}}
SMOKE_OVERRIDES = [
    "model=convs2s_tiny", "optimization.max_update=60", "dataset.max_tokens=2000",
    "dataset.batch_size=null", "common.log_interval=20", "checkpoint.no_epoch_checkpoints=true",
]


def fetch_data(recipe, data_dir, work, backtranslation=True):
    """Raw train/valid/test prefixes; the training corpora are concatenated into the work folder."""
    experiment = corpora.EXPERIMENTS[recipe.experiment]
    train = [c for c in experiment.train if backtranslation or c is not corpora.BACKTRANSLATIONS]
    langs = (experiment.src, experiment.tgt)
    train_prefix = corpora.concatenate(train, data_dir, os.path.join(work, "raw", "train"), langs)
    return experiment, train_prefix, experiment.valid.prefix(data_dir), experiment.test.prefix(data_dir)


def prepare_data(recipe, data_dir, work, backtranslation=True, workers=None):
    """Fetch and prepare a recipe's corpus in ``work/prepared``: (experiment, raw test prefix,
    prepared folder, binarized folder). The benchmark prepares its data here too. ``workers``:
    processes for tokenizing and binarizing (default: convs2s-prepare's, the usable cores)."""
    if isinstance(recipe, str):
        recipe = RECIPES[recipe]
    os.makedirs(work, exist_ok=True)
    experiment, train_prefix, valid_prefix, test_prefix = fetch_data(recipe, data_dir, work, backtranslation)
    prepared = os.path.join(work, "prepared")
    from convs2s_preprocess.pipeline import prepare  # not at the top: --help stays fast

    data_bin = prepare(prepared, experiment.src, experiment.tgt, train_prefix, valid_prefix, test_prefix,
                       romanian=recipe.romanian, bpe_merges=recipe.bpe_merges, ratio=recipe.ratio,
                       nwords=recipe.nwords, joined_dictionary=recipe.joined_dictionary,
                       workers=workers)
    return experiment, test_prefix, prepared, data_bin


def train(recipe, data_bin, work, overrides):
    """fairseq-hydra-train's training on the recipe's config; fairseq resumes from checkpoint_last.pt.

    The config is composed here and trained in this process by the steps of
    fairseq-hydra-train's ``_hydra_main``: importing that module would run its ``@hydra.main``,
    which warns that it passes no version_base. We pass hydra 1.1's, the one fairseq is written
    for: the version is global to the process, and under a later one fairseq's own use of
    ``hydra.experimental`` (to read argparse-era checkpoints) fails. The same config trains with
    ``fairseq-hydra-train --config-dir "$(convs2s-recipe --config-dir)" --config-name recipe/NAME
    task.data=...``.
    """
    from fairseq.dataclass.initialize import add_defaults
    from fairseq.dataclass.utils import omegaconf_no_object_check
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli.train import main as train_main
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    save_dir = os.path.join(work, "checkpoints")
    overrides = [f"task.data={data_bin}", f"checkpoint.save_dir={save_dir}", *overrides]
    logger.info("training: recipe/%s %s", recipe.config, " ".join(overrides))
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.1"):
        cfg = compose(config_name=f"recipe/{recipe.config}", overrides=overrides)
    add_defaults(cfg)  # the registered task's, model's, ... dataclass defaults
    with omegaconf_no_object_check():
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    OmegaConf.set_struct(cfg, True)
    distributed_utils.call_main(cfg, train_main)
    return os.path.join(save_dir, "checkpoint_best.pt")


def generate_command(recipe, data_bin, checkpoint, threads, align_dict=None):
    """fairseq-generate's command line for the test set, run by this Python (``python -m
    fairseq_cli.generate``: no console script needs to be on the PATH), with the plugin's
    absolute folder and task, and its environment: the recipe's threads as OMP_NUM_THREADS."""
    from fairseq_convs2s_ext import USER_DIR
    from fairseq_convs2s_ext.threads import environment

    command = [
        sys.executable, "-m", "fairseq_cli.generate", data_bin, "--user-dir", USER_DIR,
        "--task", "convs2s_translation", "--path", checkpoint,
        "--gen-subset", "test", "--beam", "5", "--lenpen", "1", "--batch-size", "128",
        "--required-batch-size-multiple", "1",
        "--max-len-a", str(recipe.max_len_a), "--max-len-b", str(recipe.max_len_b),
    ]
    if align_dict:
        command += ["--dataset-impl", "raw", "--replace-unk", align_dict]
    return command, environment(threads)


def generate(recipe, data_bin, checkpoint, work, threads, align_dict=None):
    """Beam 5 over the whole test set; returns the hypotheses in test-set order.

    With ``align_dict``, unknown words are replaced (``--replace-unk``): the task reads the test
    text that convs2s-prepare keeps beside the binaries as fairseq's raw text."""
    output = os.path.join(work, "generate-test-replace-unk.txt" if align_dict else "generate-test.txt")
    inputs = [checkpoint] + ([align_dict] if align_dict else [])
    if not os.path.exists(output) or os.path.getmtime(output) < max(map(os.path.getmtime, inputs)):
        command, env = generate_command(recipe, data_bin, checkpoint, threads, align_dict)
        logger.info("generating: OMP_NUM_THREADS=%s fairseq-generate %s", env["OMP_NUM_THREADS"],
                    " ".join(command[3:]))
        with atomic_outputs([output]) as (temp,):
            with open(temp, "w", encoding="utf-8") as out:  # it stops when the recipe does, even by SIGKILL
                status = run_child(command, stdout=out, stderr=None, cwd=None, env=env)
            if status:
                raise subprocess.CalledProcessError(status, command)
    hypotheses = {}
    with open(output, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                key, _, text = line.rstrip("\n").split("\t")
                hypotheses[int(key[2:])] = text
    return [hypotheses[i] for i in sorted(hypotheses)], output


def evaluate(recipe, experiment, hypotheses, test_prefix, prepared, output):
    """The recipe's metric(s) of the hypotheses against the test references."""
    tgt = experiment.tgt
    raw_refs = list(read_lines(f"{test_prefix}.{tgt}"))
    score.check_counts(hypotheses, raw_refs, output, f"{test_prefix}.{tgt}")
    words = [remove_bpe(h) if recipe.bpe_merges else h for h in hypotheses]
    if recipe.metric == "rouge":
        return {"rouge": score.rouge(words, raw_refs)}, words
    from convs2s_preprocess.stages.tokenize import detokenize

    detok = [detokenize(h.replace(unknown_words.UNK, score.UNSCORED_UNK), tgt) for h in words]
    if recipe.romanian and tgt == "ro":  # the model writes Romanian without diacritics
        raw_refs = [normalize_romanian_line(r) for r in raw_refs]
    results = {"sacrebleu": score.bleu(detok, raw_refs)}
    if recipe.metric == "tokenized-bleu":
        tok_refs = list(read_lines(os.path.join(prepared, "tok", f"test.{tgt}")))
        results["tokenized_bleu"] = score.bleu(words, tok_refs, tokenized=True)
    return results, detok


def report(name, work, results, sources, outputs, references, overrides, seconds, threads):
    lines = [f"# {name}", "", f"- test sentences: {len(outputs)}", f"- overrides: {' '.join(overrides) or 'none'}",
             f"- wall time: {seconds / 60:.1f} min", f"- CPU threads: {threads.count} ({threads.why})", ""]
    for metric, value in results.items():
        lines.append(f"- {metric}: {value['text'] if isinstance(value, dict) and 'text' in value else value}")
        if isinstance(value, dict) and "signature" in value:
            lines.append(f"  - signature: {value['signature']}")
    lines += ["", "## Examples", ""]
    for src, hyp, ref in list(zip(sources, outputs, references))[:5]:
        lines += [f"- source: {src}", f"  - output: {hyp}", f"  - reference: {ref}"]
    text = "\n".join(lines) + "\n"
    for path, content in ((os.path.join(work, "report.md"), text),
                          (os.path.join(work, "report.json"), json.dumps(results, indent=2))):
        with atomic_outputs([path]) as (temp,):
            with open(temp, "w", encoding="utf-8") as f:
                f.write(content)
    print(text)


def run(name, data_dir, work, threads, smoke=False, backtranslation=True, overrides=()):
    started = time.time()
    recipe = RECIPES[name]
    overrides = list(overrides)
    if smoke:
        if name not in SMOKE:
            raise SystemExit(f"error: no smoke mode for {name}; smoke runs exist for {', '.join(SMOKE)}")
        recipe = replace(recipe, **SMOKE[name])
        overrides = SMOKE_OVERRIDES + overrides
    # workers: convs2s-prepare's default (convs2s_preprocess.runtime.host.default_workers), not the
    # threads chosen for torch: processes do not wait on each other at every operation
    experiment, test_prefix, prepared, data_bin = prepare_data(recipe, data_dir, work, backtranslation)
    align_dict = unknown_words.align_dictionary(prepared, experiment, work) if recipe.replace_unk else None
    checkpoint = train(recipe, data_bin, work, overrides)
    hypotheses, output = generate(recipe, data_bin, checkpoint, work, threads)
    results, outputs = evaluate(recipe, experiment, hypotheses, test_prefix, prepared, output)
    if align_dict:  # the same translations with their <unk> replaced; the report shows these
        replaced, output = generate(recipe, data_bin, checkpoint, work, threads, align_dict)
        replaced_results, outputs = evaluate(recipe, experiment, replaced, test_prefix, prepared, output)
        results.update({f"{metric}_replace_unk": value for metric, value in replaced_results.items()})
        results["unknown_words"] = unknown_words.count_replacements(hypotheses, replaced, prepared, experiment,
                                                                    align_dict)
    sources = list(read_lines(f"{test_prefix}.{experiment.src}"))
    references = list(read_lines(f"{test_prefix}.{experiment.tgt}"))
    report(name + (" (smoke)" if smoke else ""), work, results, sources, outputs, references, overrides,
           time.time() - started, threads)
    return results


def parser():
    p = argparse.ArgumentParser(prog="convs2s-recipe", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=sorted(RECIPES), metavar="NAME",
                   help=f"the recipe: {', '.join(sorted(RECIPES))}")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="hydra overrides of the recipe's config (recipe/NAME.yaml in the config folder)")
    p.add_argument("--config-dir", action=PrintConfigDir,
                   help="print the folder of the installed recipe configs and exit: for fairseq-hydra-train "
                        '--config-dir "$(convs2s-recipe --config-dir)" --config-name recipe/NAME ...')
    p.add_argument("--data", default=corpora.data_root(),
                   help="corpus cache/mirror folder (env CONVS2S_DATA); missing corpora are downloaded into it "
                        "(default: %(default)s)")
    p.add_argument("--work", help="work folder (default: ./work/NAME in the current folder; "
                                  "./work/NAME-smoke with --smoke)")
    p.add_argument("--smoke", action="store_true",
                   help=f"tiny model, few updates, small local data; recipes with a smoke mode: {', '.join(SMOKE)}")
    p.add_argument("--no-backtranslation", action="store_true",
                   help="wmt16-en-ro: train on the bitext only, without Sennrich et al.'s back-translated news")
    return p


def _program(command):
    """The name a user knows a command by: fairseq-generate for ``python -m fairseq_cli.generate``."""
    if len(command) > 2 and command[1] == "-m":
        return command[2].replace("fairseq_cli.", "fairseq-")
    return os.path.basename(command[0])


def work_folder(args):
    """--work, else ./work/NAME (NAME-smoke, NAME-no-bt) in the folder the command runs in:
    never inside the installed package."""
    suffix = ("-smoke" if args.smoke else "") + ("-no-bt" if args.no_backtranslation else "")
    return os.path.abspath(args.work or os.path.join("work", args.name + suffix))


def main(argv=None):
    args = parser().parse_intermixed_args(argv)
    from hydra.errors import HydraException

    from fairseq_convs2s_ext import threads
    from fairseq_convs2s_ext.excepthook import install_excepthook

    install_excepthook()  # a checkpoint that cannot be read as training resumes: one line

    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(name)s | %(message)s")
    chosen = threads.apply(threads.current())  # this process trains; its fairseq-generate gets the same
    try:
        # one run at a time in a work folder; a full disk (a report, a corpus) is one line
        with full_disk_reported(work_folder(args)), output_lock(work_folder(args)):
            run(args.name, os.path.abspath(args.data), work_folder(args), chosen, args.smoke,
                not args.no_backtranslation, args.overrides)
    except (PreprocessError, DownloadError, score.ScoreError, HydraException) as e:
        sys.exit(f"error: {e}")
    except subprocess.CalledProcessError as e:
        sys.exit(f"error: {_program(e.cmd)} failed with exit status {e.returncode} (its output is above)")


if __name__ == "__main__":
    main()
