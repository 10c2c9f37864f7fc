"""A trained fconv model to translate with: fairseq-train, cached beside the data.

Generation speed depends on what the model outputs (an untrained model babbles up to the
length limit, and bf16's effect on BLEU only shows on a model that translates), so the
generation benchmark translates with a model trained for 5 epochs by fairseq's own
``fairseq-train`` (about 18 minutes on 2 cores alone; its BLEU is in bench/README.md) with the
demo recipe's settings (:data:`bench.training.SETTINGS`: the paper's optimizer and schedule,
label smoothing and dropout). It is trained once and reused; a half-finished run is resumed
from its last checkpoint. It is keyed by the bytes of the binarized data and by those
settings, so other data or settings train a new reference instead of reusing another one.
fairseq-train runs with the plugin's ``--user-dir``: resuming reads the checkpoint back, and
on torch >= 2.6 fairseq's own loader refuses the configuration stored in it without the
plugin's safe loading (``fairseq_convs2s_ext.checkpoints``).
"""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import fairseq_convs2s_ext
from convs2s_recipes.settings import fairseq_options

from .data import cache_root
from .training import SETTINGS


def data_fingerprint(data_bin):
    """sha256 (12 hex digits) of the binarized folder's data and dictionaries, by name
    (not of fairseq-preprocess's log, which names the machine's paths)."""
    digest = hashlib.sha256()
    for path in sorted(Path(data_bin).iterdir()):
        if path.is_file() and path.name != "preprocess.log":
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def reference_checkpoint(data_bin, arch="fconv_iwslt_de_en", epochs=5, max_tokens=4000, threads=2):
    """Path of checkpoint_last.pt of `arch` trained `epochs` epochs on `data_bin`."""
    settings = fairseq_options(SETTINGS)
    settings_fingerprint = hashlib.sha256(" ".join(settings).encode()).hexdigest()[:8]
    save_dir = cache_root() / f"reference-{Path(data_bin).parent.parent.name}-{data_fingerprint(data_bin)}-{settings_fingerprint}-{arch}-{epochs}ep"
    checkpoint = save_dir / "checkpoint_last.pt"
    done = save_dir / "done"
    if done.exists():
        return checkpoint
    print(f"training the reference {arch} ({epochs} epochs, fairseq-train) into {save_dir}", file=sys.stderr)
    command = [
        sys.executable, "-m", "fairseq_cli.train", str(data_bin), "--arch", arch,
        "--user-dir", str(Path(fairseq_convs2s_ext.__file__).parent),
        "--criterion", "label_smoothed_cross_entropy", *settings,
        "--max-tokens", str(max_tokens), "--max-epoch", str(epochs), "--seed", "1",
        "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50",
    ]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, env={**os.environ, **env})
    done.touch()
    return checkpoint
