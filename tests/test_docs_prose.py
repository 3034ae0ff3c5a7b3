"""The pages read in one pass (issue 42 item 3): every page git lists (README.md, docs/*.md) keeps its
prose in short sentences, details going into lists and tables. Measured by tests/markdown_docs.py
(prose_paragraphs, split_sentences); `python tests/markdown_docs.py --prose-table` prints each page's
numbers. The splitter itself is checked on the strings that trip naive splitters."""
import pytest

from markdown_docs import measure_prose, pages, prose_paragraphs, prose_stats, split_sentences

MAX_MEAN = 25  # words per sentence, mean over a page's prose
MAX_SENTENCE = 60  # words in any one sentence


def _sentences(text):
    return [" ".join(s) for p in prose_paragraphs(text) for s in split_sentences(p)]


def test_every_page_reads_in_short_sentences():
    stats = [prose_stats(page) for page in pages()]
    assert {s.page for s in stats} >= {"README.md", "docs/quickstart.md"} and all(s.sentences for s in stats)
    offenders = [s for s in stats if s.mean > MAX_MEAN or s.longest > MAX_SENTENCE]
    assert not offenders, (
        f"pages whose prose runs long (at most {MAX_MEAN} words per sentence on average and {MAX_SENTENCE} in "
        f"any one; lists and tables do not count, so move details there or split the sentence):\n"
        + "\n".join(f"  {s.page}: mean {s.mean:.1f} words per sentence over {s.sentences} sentences; longest "
                    f"{s.longest} words: \"{s.opening}\"" for s in offenders))


def test_abbreviations_decimals_file_names_versions_and_urls_do_not_split():
    text = ("Sparse heads, e.g. Sparsemax, keep few classes (Campos et al. 2025 measured it, i.e. The paper). "
            "Softmax vs. Sparsemax at lr 0.5 in configs/cifar10.yaml with torch 2.4.1 from "
            "https://pytorch.org/get-started/locally. It ends here!")
    assert _sentences(text) == [
        "Sparse heads, e.g. Sparsemax, keep few classes (Campos et al. 2025 measured it, i.e. The paper).",
        "Softmax vs. Sparsemax at lr 0.5 in configs/cifar10.yaml with torch 2.4.1 from "
        "https://pytorch.org/get-started/locally.",
        "It ends here!"]


def test_a_sentence_may_open_with_a_lower_case_name_but_not_after_an_ellipsis_or_etc():
    assert _sentences("eval.py writes it. compare_heads.py reads it.") == ["eval.py writes it.",
                                                                          "compare_heads.py reads it."]
    assert len(_sentences("Heads, losses etc. are declared once. A longer run (optim.epochs=...) helps.")) == 2


def test_a_link_counts_as_its_text_and_a_code_span_as_one_word():
    text = ("Read [the quick start, v1.2. Then](https://example.org/a.b?c=d.e) first. See "
            "[Campos et al.](https://arxiv.org/abs/2502.14773) now. Run "
            "`python train.py --config configs/x.yaml. Then more` now. Done.")
    sentences = [s for p in prose_paragraphs(text) for s in split_sentences(p)]
    assert [len(s) for s in sentences] == [7, 5, 3, 1]  # no sentence ends inside a link's text
    assert sentences[2] == ["Run", "`python train.py --config configs/x.yaml. Then more`", "now."]
    assert "arxiv" not in " ".join(map(" ".join, sentences))


def test_headings_lists_tables_code_and_comments_are_not_prose():
    text = "\n".join([
        "# A heading. With a period", "First sentence here. Second one:", "- an item. Another item sentence.",
        "- a second item", "continued lazily. Still the item.", "", "  indented after a blank: the item's. More.",
        "", "| a. B | c |", "|---|---|", "| x. Y | z |", "", "```bash", "echo one. Two", "```", "",
        "<!-- quickstart-numbers:readme begin. Generated -->", "After the table. Last one.", "",
        "1. a numbered item. Its second sentence.", "", "> A quoted sentence. And another."])
    assert _sentences(text) == ["First sentence here.", "Second one:", "After the table.", "Last one.",
                                "A quoted sentence.", "And another."]


def test_the_measure_counts_words_sentences_and_the_longest():
    words = " ".join(f"w{i}" for i in range(12))
    stats = measure_prose(f"# Title words here\n\nOne two three. {words}.\n\n- a list item of many words here\n",
                          "page.md")
    assert (stats.page, stats.words, stats.sentences, stats.longest) == ("page.md", 15, 2, 12)
    assert stats.mean == pytest.approx(7.5) and stats.opening == "w0 w1 w2 w3 w4 w5 w6 w7 ..."
    assert measure_prose("# Only a heading\n\n| a | b |\n").sentences == 0
