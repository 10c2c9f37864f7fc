"""convs2s-score: detokenized sacreBLEU where ``fairseq-score --sacrebleu`` fails, on plain text
and on fairseq-generate's output (its D- lines in sentence order, BPE removed and detokenized
with -l)."""
import sacrebleu

from cli_helpers import run, write_lines

REFS = ["Two dogs play in the snow.", "A man, wearing a hat, rides a bike."]


def test_plain_detokenized_text_scores_as_sacrebleu(tmp_path):
    write_lines(tmp_path / "ref", REFS)
    hyps = ["Two dogs play in snow.", "A man in a hat rides a bike."]
    write_lines(tmp_path / "hyp", hyps)
    out = run("convs2s-score", "-r", tmp_path / "ref", "-s", tmp_path / "hyp")
    assert out.splitlines()[0] == str(sacrebleu.corpus_bleu(hyps, [REFS]))


def test_generate_output_is_read_in_sentence_order_and_detokenized(tmp_path):
    write_lines(tmp_path / "ref", REFS)
    write_lines(tmp_path / "generate.out", [  # fairseq-generate's order: by length, not by id
        "S-1\tA man , wearing a hat , ri@@ des a bike .", "H-1\t-0.5\tA man , wearing a hat , ri@@ des a bike .",
        "D-1\t-0.5\tA man , wearing a hat , ri@@ des a bike .", "P-1\t-0.1 -0.2",
        "S-0\tTwo dogs play in the snow .", "H-0\t-0.4\tTwo dogs play in the snow .",
        "D-0\t-0.4\tTwo dogs play in the snow .", "Generate test with beam=5: BLEU4 = 100.00"])
    out = run("convs2s-score", "-r", tmp_path / "ref", "-s", tmp_path / "generate.out", "-l", "en")
    assert out.startswith("BLEU = 100.00 ")


def test_a_missing_translation_is_refused_in_one_line(tmp_path):
    write_lines(tmp_path / "ref", REFS)
    proc = run("convs2s-score", "-r", tmp_path / "ref", check=False, input="Two dogs play in the snow.\n")
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"convs2s-score: error: 1 hypotheses (-) for 2 references ({tmp_path / 'ref'}): every test sentence must "
        "be translated; generate with --required-batch-size-multiple 1 and without --skip-invalid-size-inputs-valid-test"]
