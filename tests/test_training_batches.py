"""The training batches of a run resumed from a checkpoint are an uninterrupted run's."""
import torch
from fairseq.data import LanguagePairDataset
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from fairseq_convs2s_ext.tasks import ConvS2STranslationTask
from fairseq_convs2s_ext.tasks.convs2s_translation import ConvS2STranslationConfig
from model_helpers import build


def epoch_batches(task_cls, start_epoch, epochs):
    """The sentence ids of each batch of ``epochs``, from a task that makes its training iterator
    at ``start_epoch`` (1: an uninterrupted run; later: a run resumed at that epoch)."""
    torch.manual_seed(0)
    _, d = build(vocab=30)
    tokens = [torch.randint(4, 30, (3 + i % 5,)) for i in range(60)]  # many sentences of each length
    dataset = LanguagePairDataset(tokens, [len(t) for t in tokens], d, tokens, [len(t) for t in tokens], d)
    config = ConvS2STranslationConfig() if task_cls is ConvS2STranslationTask else TranslationConfig()
    task = task_cls(config, d, d)
    task.datasets["train"] = dataset
    batches = {}
    for epoch in range(start_epoch, start_epoch + epochs):
        iterator = task.get_batch_iterator(dataset, max_tokens=40, seed=1, epoch=epoch)
        assert iterator.next_epoch_idx == epoch
        batches[epoch] = [batch["id"].tolist() for batch in iterator.next_epoch_itr(shuffle=True)]
    return batches


def test_a_resumed_run_trains_on_the_uninterrupted_run_s_batches():
    uninterrupted = epoch_batches(ConvS2STranslationTask, 1, 3)
    assert uninterrupted[2] != uninterrupted[3]  # each epoch shuffles the batches
    assert epoch_batches(ConvS2STranslationTask, 2, 2) == {2: uninterrupted[2], 3: uninterrupted[3]}
    assert epoch_batches(ConvS2STranslationTask, 3, 1) == {3: uninterrupted[3]}


def test_fairseq_s_translation_task_batches_a_resumed_run_otherwise():
    """The fault this guards against: fairseq orders the sentences with the seed plus the
    epoch the iterator is made at, so equal-length sentences fall into other batches."""
    uninterrupted, resumed = epoch_batches(TranslationTask, 1, 2)[2], epoch_batches(TranslationTask, 2, 1)[2]
    assert sorted(map(len, uninterrupted)) == sorted(map(len, resumed)) and uninterrupted != resumed
