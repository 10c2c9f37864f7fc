"""Which dictionaries a checkpoint was trained with, checked whenever it is loaded.

A model's weights mean something only with the dictionaries that numbered its words. Given
other dictionaries of the same size, fairseq loads a checkpoint without complaint and
translates garbage with exit status 0. So the encoder and the decoder each keep, as a
buffer saved with the weights, the sha256 of their dictionary's symbols in order
(:func:`fingerprint`), and compare it with the dictionary they are built with whenever a
checkpoint is loaded into them (:func:`check_fingerprint`, from fairseq's
``upgrade_state_dict_named`` hook, which every loader calls: fairseq-generate,
fairseq-interactive, fairseq-train ``--restore-file``, the hub's ``from_pretrained``).
A checkpoint written before the fingerprint existed loads with a warning.
"""
import hashlib
import logging

import torch

from .errors import DictionaryMismatch

logger = logging.getLogger(__name__)

BUFFER = "dictionary_fingerprint"


def fingerprint(dictionary) -> torch.Tensor:
    """sha256 of the dictionary's symbols (specials included) in index order, 32 bytes."""
    digest = hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).digest()
    return torch.tensor(list(digest), dtype=torch.uint8)


def describe_dictionary(dictionary) -> str:
    where = getattr(dictionary, "filename", None)
    return f"{where + ' ' if where else ''}({len(dictionary)} symbols, sha256 {_hex(fingerprint(dictionary))})"


def _hex(value: torch.Tensor) -> str:
    return bytes(value.tolist()).hex()[:16]


def check_fingerprint(state_dict, key: str, dictionary, side: str) -> None:
    """Raise DictionaryMismatch if ``state_dict[key]`` is not ``dictionary``'s fingerprint;
    fill it in, with a warning, if the checkpoint has none."""
    expected = fingerprint(dictionary)
    stored = state_dict.get(key)
    if stored is None:
        logger.warning("the checkpoint has no fingerprint of its %s dictionary (written before "
                       "the plugin recorded one): cannot check that %s is the one it was "
                       "trained with", side, describe_dictionary(dictionary))
        state_dict[key] = expected
        return
    if not torch.equal(stored.to(expected.device, expected.dtype), expected):
        raise DictionaryMismatch(
            f"the checkpoint was trained with another {side} dictionary (sha256 {_hex(stored)}) "
            f"than the one given, {describe_dictionary(dictionary)}: its word ids would be "
            f"read as other words. Use the data folder (dict.*.txt) the model was trained with."
        )
