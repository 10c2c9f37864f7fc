"""Issue 34: SIGKILL at random moments and a full disk at each write, on real runs of
convs2s-prepare, convs2s-align-dict, fairseq-train with the plugin and
convs2s-average-checkpoints (see faults.py). The default run tries a few seeded faults of
each kind; ``-m slow`` tries many. A failure message starts with the seed that replays it.
"""
import os
import shutil

import pytest
import torch

import fairseq_convs2s_ext  # noqa: F401  (checkpoints load with weights_only)
from faults import FLOOR, Case, command, failure_limits, kill_and_resume, limited_run, one_clear_line, reproduce, \
    rng, run, same_files, timed, write_order
from tiny_runs import USER_DIR

LINES = {"train": ("train", 500), "valid": ("val", 40), "test": ("test_2016_flickr", 40)}
# SIGKILLs per command by default (about a minute in all with the full disk's runs; the
# averaging, one atomic write at its end, only under -m slow), and under -m slow.
DEFAULT_KILLS = {"prepare": 1, "align-dict": 2, "train": 1, "average": 0}
SLOW_KILLS = 12
# Full disk: so many of the stepped limits (drawn with the seed) by default, all under -m slow.
DEFAULT_LIMITS = {"prepare": 1, "align-dict": 2, "average": 1}


def _raw(data_dir, folder):
    folder.mkdir(parents=True, exist_ok=True)
    for split, (name, count) in LINES.items():
        for lang in ("en", "de"):
            lines = (data_dir / "multi30k" / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()[:count]
            (folder / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return folder


def _copy(source, target):
    """Hard links of ``source``'s files under ``target`` (inputs are read, never written)."""
    shutil.copytree(source, target, copy_function=os.link, dirs_exist_ok=True)


def _same_training(reference, folder):
    """fairseq's promise after a resume: the checkpoints load and training completed; on the
    CPU, with per-update seeds, the resumed run's weights and losses are the uninterrupted
    run's exactly."""
    problems = []
    for name in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint_last.pt", "checkpoint_best.pt"):
        try:
            ours = torch.load(folder / "ck" / name, map_location="cpu", weights_only=True)
        except Exception as e:  # the harness reports any failure to load as a finding
            problems.append(f"{name} does not load: {e}")
            continue
        theirs = torch.load(reference / "ck" / name, map_location="cpu", weights_only=True)
        if ours["extra_state"]["train_iterator"]["epoch"] != theirs["extra_state"]["train_iterator"]["epoch"]:
            problems.append(f"{name}: another epoch")
        if ours["extra_state"].get("val_loss") != theirs["extra_state"].get("val_loss"):
            problems.append(f"{name}: validation loss {ours['extra_state'].get('val_loss')} "
                            f"!= {theirs['extra_state'].get('val_loss')}")
        changed = [key for key, value in theirs["model"].items() if not torch.equal(value, ours["model"][key])]
        if changed:
            problems.append(f"{name}: other weights ({', '.join(changed[:3])} ...)")
    left = sorted(p.name for p in (folder / "ck").iterdir() if p.name.endswith(".tmp"))
    return problems + [f"ck/{name}: left behind" for name in left]


@pytest.fixture(scope="module")
def cases(tmp_path_factory, data_dir):
    """The four commands on a Multi30k slice, each with its reference (uninterrupted) run,
    run when first asked for, that run's duration and start: ``cases(name)`` = (case,
    reference folder, seconds, start in ns)."""
    root = tmp_path_factory.mktemp("faults")
    raw = _raw(data_dir, root / "raw")
    made = {}

    def measured(case):
        reference = root / "reference" / case.name
        made[case.name] = (case, reference, *timed(case, reference))

    def prepared():
        return cases_made("prepare")[1] / "prepared"

    def trained():
        return cases_made("train")[1] / "ck"

    def align_dict():
        return Case("align-dict", lambda folder: _copy(prepared() / "tok", folder), command(
            "convs2s-align-dict", "--src", "train.clean.en", "--tgt", "train.clean.de", "-o", "out/align.dict",
            "--candidates", "out/candidates"), same_files)

    def train():
        return Case("train", lambda folder: folder.mkdir(parents=True, exist_ok=True), command(
            "fairseq-train", prepared() / "bin", "--user-dir", USER_DIR, "--task", "convs2s_translation", "--arch",
            "convs2s_tiny", "--optimizer",
            "nag", "--lr", "0.25", "--momentum", "0.99", "--clip-norm", "0.1", "--criterion",
            "convs2s_cross_entropy", "--max-tokens", "1000", "--save-dir", "ck", "--no-progress-bar", "--seed", "1",
            "--num-workers", "0", "--max-epoch", "2"), _same_training)

    def average():
        return Case("average", lambda folder: _copy(trained(), folder / "ck"), command(
            "convs2s-average-checkpoints", "--inputs", "ck", "--num-epoch-checkpoints", "2", "-o", "averaged.pt"),
            same_files)

    def prepare():
        return Case("prepare", lambda folder: folder.mkdir(parents=True, exist_ok=True), command(
            "convs2s-prepare", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "valid",
            "--testpref", raw / "test", "-o", "prepared", "--bpe-merges", "300", "--workers", "1"), same_files)

    builders = {"prepare": prepare, "align-dict": align_dict, "train": train, "average": average}

    def cases_made(name):
        if name not in made:
            measured(builders[name]())
        return made[name]
    return cases_made


def _kills(cases, name, kills, tmp_path, test):
    case, reference, seconds, _ = cases(name)
    problems = kill_and_resume(case, reference, seconds, tmp_path / name, kills, rng(test))
    print(f"faults tried: {name}: {kills} SIGKILLs, {'failed' if problems else 'passed'}")
    assert not problems, f"{reproduce(test)} {name}, {kills} kills in {seconds:.1f} s:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", [name for name, kills in DEFAULT_KILLS.items() if kills])
def test_killed_runs_resume_to_the_uninterrupted_result(cases, name, tmp_path, request):
    _kills(cases, name, DEFAULT_KILLS[name], tmp_path, f"test_faults.py::{request.node.name}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DEFAULT_KILLS))
def test_many_killed_runs_resume_to_the_uninterrupted_result(cases, name, tmp_path, request):
    _kills(cases, name, SLOW_KILLS, tmp_path, f"test_faults.py::{request.node.name}")


def _full_disk(cases, name, tmp_path, test, count):
    case, reference, _, started = cases(name)
    limits = failure_limits(write_order(reference, started))
    if count is not None:
        limits = sorted(rng(test).sample(limits, min(count, len(limits))))
    stopped, problems = 0, []
    for number, limit in enumerate(limits):
        stopped_here, found = limited_run(case, reference, tmp_path / f"{name}-{number}", limit)
        stopped += stopped_here
        problems += found
    print(f"faults tried: {name}: {len(limits)} file-size limits ({stopped} stopped the run), "
          f"{'failed' if problems else 'passed'}")
    assert stopped, f"{reproduce(test)} {name}: no limit of {limits} stopped the run: the test tests nothing"
    assert not problems, f"{reproduce(test)} {name}, limits {limits}:\n" + "\n".join(problems)


FULL_DISK = list(DEFAULT_LIMITS)


@pytest.mark.parametrize("name", FULL_DISK)
def test_a_full_disk_stops_with_one_line_and_the_rerun_completes(cases, name, tmp_path, request):
    _full_disk(cases, name, tmp_path, f"test_faults.py::{request.node.name}", DEFAULT_LIMITS[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_DISK)
def test_a_full_disk_at_every_write(cases, name, tmp_path, request):
    _full_disk(cases, name, tmp_path, f"test_faults.py::{request.node.name}", None)


def test_a_recipe_on_a_full_disk_stops_with_one_line(tmp_path):
    """The recipe's first write, its work folder's lock, fails: one line, nothing left."""
    done = run(command("convs2s-recipe", "multi30k-unk", "--smoke", "--work", tmp_path / "work"), tmp_path,
               file_size_limit=FLOOR)
    assert done.returncode == 1 and not one_clear_line(done), done.stderr
    assert os.listdir(tmp_path / "work") == []
