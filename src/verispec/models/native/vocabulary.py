"""Which ids a draft that scores part of the vocabulary keeps.

A draft's q only has to be the distribution its tokens are drawn from, and every lossless
verifier stays lossless when q is zero outside a set of ids that depends only on the past
(the target keeps its whole vocabulary). A smaller lm_head makes every draft step cheaper:
the 0.5B draft's tied 151,936-row head is 27% of its weight bytes.

A row of such a draft scores

* the **static set** S: the end-of-text ids and the ids used most often in a reference
  text (:func:`ranked_ids`), rounded up to a multiple of :data:`SUBSET_MULTIPLE`; and
* the **context ids** C of that row: every id it has been fed (its prompt, the tokens
  decoded since, and the tokens of the pass itself up to each scored position), scored with
  the same head function on their own rows (:class:`ContextIds`). Identifiers of a prompt
  are rare in any reference text but likely in its continuation.

The reference text is the source of the top-level modules of Python's standard library
(code, comments and docstrings, 4.7 MB for Python 3.11), read where the running Python
keeps it, so nothing is downloaded; ids that never occur there follow in id order
(byte-level BPE lists its earlier merges first). Without a fast tokenizer the ranking is
the id order.
"""

from __future__ import annotations

import collections
import hashlib
import json
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["SUBSET_MULTIPLE", "ContextIds", "ranked_ids", "reference_files", "subset_ids"]

#: The static set's size is a multiple of this (the CPU int4 kernel packs rows by 16).
SUBSET_MULTIPLE = 16


def reference_files() -> list[Path]:
    """The reference text: the top-level ``*.py`` modules of Python's standard library."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _tokenizer_key(tokenizer: Any, files: Sequence[Path]) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(vocab).encode())
    digest.update(json.dumps([[f.name, f.stat().st_size] for f in files]).encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def ranked_ids(tokenizer: Any, vocab: int,
               progress: Callable[[str], None] | None = None) -> list[int]:
    """All ``vocab`` ids, most frequent in the reference text first (ties and unseen ids in
    id order); the id order itself for a tokenizer that is not a fast one. Counted once per
    tokenizer and Python installation and kept in verispec's cache directory."""
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        return list(range(vocab))
    from verispec.models.fetch import cache_dir, save_record

    files = reference_files()
    file = cache_dir() / "vocabulary" / f"ranked-{_tokenizer_key(tokenizer, files)}.json"
    try:
        ranked = json.loads(file.read_text())
        if isinstance(ranked, list) and len(ranked) == vocab:
            return [int(i) for i in ranked]
    except (OSError, ValueError):
        pass
    if progress:
        progress(f"counting token ids in {len(files)} standard-library modules (once)")
    counts: collections.Counter[int] = collections.Counter()
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    ranked = sorted(range(vocab), key=lambda i: (-counts.get(i, 0), i))
    save_record(file, ranked)
    return ranked


def subset_ids(size: int | None, vocab: int, eos: frozenset[int], tokenizer: Any = None,
               progress: Callable[[str], None] | None = None) -> Tensor | None:
    """The static set [S] (ascending) of a draft that scores ``size`` of the ``vocab`` ids:
    the end-of-text ids, then ids in :func:`ranked_ids` order up to at least ``size`` ids
    and a multiple of :data:`SUBSET_MULTIPLE`; None for the whole vocabulary."""
    if size is None:
        return None
    if size < 1:
        raise ValueError(f"a vocabulary subset needs at least one id, got {size}")
    wanted = -(-size // SUBSET_MULTIPLE) * SUBSET_MULTIPLE
    if wanted >= vocab:
        return None
    kept = {i for i in eos if i < vocab}
    for i in ranked_ids(tokenizer, vocab, progress):
        if len(kept) >= wanted:
            break
        kept.add(i)
    return torch.tensor(sorted(kept), dtype=torch.int64)


class ContextIds:
    """Per row, the ids it has been fed that lie outside the static set (the context ids).

    The model calls :meth:`add_rows`, :meth:`select` and :meth:`reset` as it changes rows,
    and :meth:`extend` with each pass's tokens; :meth:`extend` returns what the pass must
    score besides the static set. A row's set only grows: a token a pass rolls back was
    drawn by the draft from ids it already scored, so a rollback never removes an id that
    another fed token did not bring."""

    def __init__(self, static: Tensor) -> None:
        self.static = frozenset(static.tolist())
        self.rows: list[set[int]] = []

    def _outside(self, tokens: Sequence[int]) -> set[int]:
        return set(tokens) - self.static

    def reset(self) -> None:
        self.rows = []

    def add_rows(self, prefixes: Sequence[Sequence[int]]) -> None:
        self.rows += [self._outside(p) for p in prefixes]

    def select(self, indices: Sequence[int]) -> None:
        self.rows = [set(self.rows[i]) for i in indices]  # a fork gets its own copy

    def extend(self, tokens: Sequence[Sequence[int]], num_logits: int,
               device: torch.device) -> tuple[Tensor, Tensor] | None:
        """Record each row's new ``tokens``; (ids [U], allowed [R n, U]) for the pass's
        ``num_logits`` scored positions per row (the last ones of each row's tokens; row b's
        position j sees the ids fed up to and including its token j), or None when no row
        has a context id."""
        before = [set(r) for r in self.rows]
        for row, new in zip(self.rows, tokens, strict=True):
            row |= self._outside(new)
        union = sorted(set().union(*self.rows))
        if not union:
            return None
        column = {t: u for u, t in enumerate(union)}
        allowed = []  # per row [n, U]: position j sees an id fed at or before its token
        for seen, new in zip(before, tokens, strict=True):
            first = len(new) - min(num_logits, len(new))  # token of the first scored position
            since = dict.fromkeys(union, num_logits)  # scored index from which an id is seen
            since.update(dict.fromkeys(seen, 0))
            for j, t in enumerate(new):
                if t in column and since[t] > max(j - first, 0):
                    since[t] = max(j - first, 0)
            starts = list(since.values())
            allowed.append([[s <= j for s in starts] for j in range(num_logits)])
        ids = torch.tensor(union, dtype=torch.int64, device=device)  # [U]
        mask = torch.tensor(allowed, dtype=torch.bool, device=device)  # [R, n, U]
        return ids, mask.view(-1, len(union))  # [R n, U]
