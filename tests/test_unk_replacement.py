"""Unknown-word replacement and the ``convs2s_translation`` task, without the command line."""
from argparse import Namespace

import pytest
import torch
from fairseq import options
from fairseq.data import LanguagePairDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.tasks import TASK_REGISTRY
from fairseq.tasks.translation import TranslationConfig, TranslationTask

import fairseq_cli.generate
from fairseq_convs2s_ext.tasks import ConvS2STranslationTask
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig
from fairseq_convs2s_ext.data import SourceTextDataset, raw_lines
from fairseq_convs2s_ext.generation.unknown_words import replace_unknowns, source_words
from model_helpers import build

UNK = "<unk>"
ALIGN = {"zebra": "Zebra", "Zug": "train"}


def attention(*rows):
    return torch.tensor(rows, dtype=torch.float)


# --- the choice of the source word (hand-built attention) ---------------------------------

def test_most_attended_word_is_translated_or_copied():
    hypothesis = ["Ein", UNK, "läuft", UNK, "</s>"]
    source = ["A", "zebra", "runs", "Quux"]
    att = attention(
        [0.7, 0.1, 0.1, 0.1],
        [0.1, 0.6, 0.2, 0.1],  # zebra -> in the dictionary
        [0.1, 0.1, 0.7, 0.1],
        [0.2, 0.3, 0.1, 0.4],  # Quux -> not in the dictionary: copied
        [0.25, 0.25, 0.25, 0.25],
    )
    assert replace_unknowns(hypothesis, att, source, ALIGN, UNK) == ["Ein", "Zebra", "läuft", "Quux", "</s>"]


def test_end_of_sentence_and_positions_past_the_source_are_never_chosen():
    source = ["A", "zebra", "Quux"]  # 3 words; column 3 is the end of sentence, 4 past the source
    att = attention(
        [0.05, 0.1, 0.05, 0.8, 0.0],  # highest on the end of sentence: the best word wins
        [0.1, 0.0, 0.2, 0.0, 0.7],    # highest past the source
    )
    assert replace_unknowns([UNK, UNK], att, source, ALIGN, UNK) == ["Zebra", "Quux"]


def test_more_source_words_than_attention_columns_considers_the_attended_ones_only():
    att = attention([0.2, 0.8])  # the text has a third word the model never saw
    assert replace_unknowns([UNK], att, ["zebra", "Quux", "Extra"], ALIGN, UNK) == ["Quux"]


def test_ties_go_to_the_earlier_word():
    assert replace_unknowns([UNK], attention([0.4, 0.4, 0.2]), ["Quux", "zebra", "x"], ALIGN, UNK) == ["Quux"]


def test_an_empty_source_leaves_the_unknown():
    assert replace_unknowns([UNK, "</s>"], attention([1.0], [1.0]), [], ALIGN, UNK) == [UNK, "</s>"]


def test_bpe_pieces_are_joined_into_the_word_they_belong_to():
    assert source_words(["Der", "Zu@@", "g", "fähr@@", "t"]) == (["Der", "Zug", "fährt"], [0, 1, 1, 2, 2])
    source = ["The", "Zu@@", "g", "Qu@@", "ux"]
    att = attention([0.1, 0.6, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1, 0.6])
    assert replace_unknowns([UNK, UNK], att, source, ALIGN, UNK) == ["train", "Quux"]


def test_bpe_unknown_inside_a_target_word_is_not_replaced():
    att = attention([1.0, 0.0], [0.0, 1.0], [1.0, 0.0])
    assert replace_unknowns(["Ze@@", UNK, UNK], att, ["zebra", "Quux"], ALIGN, UNK) == ["Ze@@", UNK, "Zebra"]


# --- the generator, on a real model and fairseq's own beam search ---------------------------

@pytest.fixture
def task_and_model():
    """A fresh dictionary each time: replacement adds its words to the target dictionary."""
    torch.manual_seed(0)
    model, d = build(vocab=30)
    model.eval()
    return ConvS2STranslationTask(ConvS2STranslationConfig(), d, d), model


def translate(task, model, lines, align_dict_path):
    """Translate ``lines`` through the task's generator, greedily and with a huge bonus on
    <unk> (--unkpen -100), so that every hypothesis word is unknown and gets replaced."""
    d = task.source_dictionary
    tokens = [d.encode_line(line, add_if_not_exist=False).long() for line in lines]
    pairs = LanguagePairDataset(tokens, [len(t) for t in tokens], d, tgt_dict=d)
    sample = SourceTextDataset(pairs, lines).collater([pairs[i] for i in range(len(lines))])
    args = Namespace(replace_unk=align_dict_path, beam=1, max_len_a=0, max_len_b=4, unkpen=-100)
    generator = task.build_generator([model], args)
    hypos = task.inference_step(generator, [model], sample)
    return sample, hypos


def expected_replacement(src_row, attention_column, line):
    """The most attended source word of one hypothesis position, computed from scratch."""
    words = [i for i, t in enumerate(src_row.tolist()) if t not in (1, 2)]  # not pad / eos
    scores = attention_column[words]
    word = line.split()[int(scores.argmax())]
    return ALIGN.get(word, word)


def test_generator_replaces_every_unknown_by_its_attended_source_word(task_and_model, tmp_path):
    task, model = task_and_model
    align_file = tmp_path / "align.dict"
    align_file.write_text("".join(f"{s} {t}\n" for s, t in ALIGN.items()))
    # different lengths: the shorter sentences are left-padded in the batch
    lines = ["w3 zebra w7 Quux w12", "Zug w5", "w9 w4 Quux"]
    sample, hypos = translate(task, model, lines, str(align_file))
    tgt = task.target_dictionary
    for i, nbest in enumerate(hypos):
        row = sample["id"].tolist()[i]
        for hypo in nbest:
            words = [tgt[t] for t in hypo["tokens"][:-1]]
            assert len(words) == 4 and UNK not in words
            expected = [expected_replacement(sample["net_input"]["src_tokens"][i], hypo["attention"][:, j],
                                             lines[row]) for j in range(4)]
            assert words == expected


def test_generator_without_a_word_to_copy_writes_the_escaped_unknown(task_and_model):
    task, model = task_and_model
    sample, hypos = translate(task, model, ["", "<unk>"], "")  # empty; a literal <unk>
    tgt = task.target_dictionary
    by_line = {row: hypos[i] for i, row in enumerate(sample["id"].tolist())}
    assert [tgt[t] for t in by_line[0][0]["tokens"][:-1]] == []  # an empty source: empty translation
    assert [tgt[t] for t in by_line[1][0]["tokens"][:-1]] == ["<<unk>>"] * 4


def test_generator_needs_the_source_text(task_and_model):
    task, model = task_and_model
    d = task.source_dictionary
    pairs = LanguagePairDataset([torch.tensor([4, 5, 2])], [3], d, tgt_dict=d)
    sample = pairs.collater([pairs[0]])  # a plain fairseq batch, without src_text
    generator = task.build_generator([model], Namespace(replace_unk="", beam=2))
    with pytest.raises(ValueError, match="source text"):
        generator.generate([model], sample)


# --- the task -----------------------------------------------------------------------------

def test_task_is_registered_under_its_own_name():
    assert TASK_REGISTRY["convs2s_translation"] is ConvS2STranslationTask


def parse_generate(*argv):
    parser = options.get_generation_parser()
    return options.parse_args_and_arch(parser, ["DATA", "--path", "nonexistent.pt", *argv])


def test_bare_replace_unk_means_copy_only():
    def cfg(*argv):
        return convert_namespace_to_omegaconf(parse_generate("--task", "convs2s_translation", *argv))

    bare = cfg("--replace-unk")
    assert bare.generation.replace_unk == "" and bare.task.replace_unk == ""
    assert cfg("--replace-unk", "a.dict").task.replace_unk == "a.dict"
    assert cfg().task.replace_unk is None


def test_the_plugin_patches_no_fairseq_command():
    """fairseq-generate is fairseq's own: its assertion that --replace-unk needs raw text holds
    for every task, and the plugin's task reads that raw text (no replaced main)."""
    assert fairseq_cli.generate.main.__module__ == "fairseq_cli.generate"
    with pytest.raises(AssertionError, match="raw text"):
        fairseq_cli.generate.main(parse_generate("--task", "convs2s_translation", "--replace-unk", "a.dict"))


def test_every_sentence_of_an_evaluation_split_is_batched():
    """fairseq drops a last batch whose size is not a multiple of 8; the task does not."""
    torch.manual_seed(0)
    _, d = build(vocab=30)
    tokens = [torch.randint(4, 30, (n,)) for n in range(3, 16)]  # 13 sentences

    def batched(task_cls):
        dataset = LanguagePairDataset(tokens, [len(t) for t in tokens], d, tgt_dict=d)
        config = ConvS2STranslationConfig() if task_cls is ConvS2STranslationTask else TranslationConfig()
        itr = task_cls(config, d, d).get_batch_iterator(
            dataset, max_sentences=4, required_batch_size_multiple=8)
        return sum(len(batch["id"]) for batch in itr.next_epoch_itr(shuffle=False))

    assert batched(TranslationTask) < 13  # the bug this guards against
    assert batched(ConvS2STranslationTask) == 13


def test_the_words_come_from_fairseq_raw_text_datasets(tmp_path):
    """raw_lines finds the text of a raw-text dataset through fairseq's wrappers, and None for
    binarized data (whose words are gone)."""
    from fairseq.data import AppendTokenDataset, Dictionary, TruncateDataset
    from fairseq.data.indexed_dataset import IndexedRawTextDataset, infer_dataset_impl

    d = Dictionary()
    for word in "a b c".split():
        d.add_symbol(word)
    (tmp_path / "test.en-de.en").write_text("a b\nc zebra\n", encoding="utf-8")
    raw = IndexedRawTextDataset(str(tmp_path / "test.en-de.en"), d)
    assert raw_lines(raw) == ["a b", "c zebra"]
    assert raw[1].tolist() == [d.index("c"), d.unk(), d.eos()]  # ids as the binaries have them
    assert raw_lines(AppendTokenDataset(TruncateDataset(raw, 10), d.eos())) == ["a b", "c zebra"]
    tokens = [torch.tensor([4, 5, 2])]
    assert raw_lines(LanguagePairDataset(tokens, [3], d).src) is None
    assert infer_dataset_impl(str(tmp_path / "test.en-de.en")) == "raw"
