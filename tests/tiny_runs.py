"""Real folders for end-to-end tests: a few hundred Multi30k lines prepared with
convs2s-prepare, and a tiny ConvS2S trained on them for a few updates with fairseq-train."""
from cli_helpers import PAPER_OPTIONS, run, write_lines
from conftest import ROOT

USER_DIR = ROOT / "fairseq_convs2s_ext"

SPLITS = {"train": ("train", 300), "valid": ("val", 30), "test": ("test_2016_flickr", 20)}


def raw_multi30k(data_dir, work):
    """The first lines of Multi30k en-de's splits, as raw text (prefix work/raw/SPLIT)."""
    (work / "raw").mkdir(parents=True, exist_ok=True)
    for split, (name, count) in SPLITS.items():
        for lang in ("en", "de"):
            lines = (data_dir / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            write_lines(work / "raw" / f"{split}.{lang}", lines)
    return work / "raw"


def prepare(data_dir, work, *options):
    """convs2s-prepare on raw_multi30k's text; returns the prepared folder."""
    raw = raw_multi30k(data_dir, work)
    run("convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "valid",
        "--testpref", raw / "test", "-o", work / "prepared", "--workers", "1", *options)
    return work / "prepared"


def word_level(data_dir, work, lines, nwords):
    """Multi30k en-de's first ``lines`` = {split: (file name, count)} prepared by convs2s-prepare
    at word level with ``nwords`` words a side (rarer words become <unk>); returns the prepared
    folder (bin/, and tok/train.clean.LANG for convs2s-align-dict)."""
    for split, (name, count) in lines.items():
        for lang in ("en", "de"):
            text = (data_dir / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            write_lines(work / f"{split}.{lang}", text)
    prepared = work / "prepared"
    run("convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", work / "train", "--validpref", work / "valid",
        "--testpref", work / "test", "--no-bpe", "--nwords", nwords, "--separate-dictionaries", "-o", prepared)
    return prepared


def train_paper(data_bin, save_dir, *extra):
    """convs2s_tiny trained by fairseq-train with the paper's settings and convs2s_translation;
    returns checkpoint_best.pt."""
    run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "convs2s_translation", "--arch", "convs2s_tiny",
        "--criterion", "convs2s_cross_entropy", *PAPER_OPTIONS, "--num-workers", 0, "--save-dir", save_dir,
        "--no-epoch-checkpoints", "--seed", 1, *extra)
    return save_dir / "checkpoint_best.pt"


def train(data_bin, save_dir, *extra):
    """convs2s_tiny trained by fairseq-train (default: 10 updates)."""
    return run("fairseq-train", data_bin, "--user-dir", "fairseq_convs2s_ext", "--arch", "convs2s_tiny",
               "--optimizer", "nag", "--lr", "0.25", "--momentum", "0.99", "--clip-norm", "0.1",
               "--criterion", "convs2s_cross_entropy", "--max-tokens", "1000", "--save-dir", save_dir,
               "--no-progress-bar", "--seed", "1", "--num-workers", "0", *(extra or ("--max-update", "10")))


def prepared_for_generation(data, checkpoint, *generation_options, max_sentences=32):
    """The task, models (prepared as fairseq-generate prepares them), test batches and the
    generation config, for fairseq-generate's command line with ``generation_options``."""
    from fairseq import checkpoint_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks import setup_task

    args = options.parse_args_and_arch(options.get_generation_parser(), [
        str(data), "--user-dir", str(USER_DIR), "--task", "convs2s_translation", "--path", str(checkpoint),
        *map(str, generation_options)])
    cfg = convert_namespace_to_omegaconf(args)
    task = setup_task(cfg.task)
    task.load_dataset("test")
    models, _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], task=task)
    for m in models:
        m.prepare_for_inference_(cfg)
    batches = task.get_batch_iterator(task.dataset("test"), max_sentences=max_sentences).next_epoch_itr(shuffle=False)
    return task, models, list(batches), cfg.generation
