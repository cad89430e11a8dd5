"""LazyTables from the byte DFAs that compile workers send ahead of their tables.

A compile worker builds a constraint's byte DFA first, then walks the vocabulary through it
from every state and computes distances (compiler/compile.py): at 200k tokens the walk is
most of the compile. The worker sends the DFA to the pool as soon as it is built
(compiler/worker.py); `FirstMasks` turns it into a LazyTable here, in the server's process,
so that a request can start generating on masks walked state by state while its table is
compiled. The table cache (`TableCache.fetch_first`) hands out whichever comes first.

No LazyTable is made (the request waits for the table) when the worker sends no DFA (over
`worker.EARLY_DFA_MAX_STATES`), when some state reaches acceptance only through a byte
that is no token by itself, or when no output can be spelled at all (the compile's own
error then answers the request).
"""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gclm.compiler.constraint import Constraint
from gclm.compiler.lazy_table import LazyTable
from gclm.compiler.tables import UNREACHABLE
from gclm.compiler.token_walk import ByteDfa, byte_dfa
from gclm.compiler.vocabulary import TokenVocabulary

log = logging.getLogger("gclm.compiler")

_WARM_UP_REGEX = "[a-z]{1,3}"  # a regex whose byte DFA takes no time to build


class FirstMasks:
    """`TableCache`'s `first_masks`: a Future of a LazyTable for a compile in flight.

    Args:
        early_dfa: the pool's `early_dfa` (a Future of a compile's (next, accepting), or
            None when nothing of the constraint is compiling).
        vocab: the vocabulary the tables are compiled for.
    """

    def __init__(self, early_dfa: Any, vocab: TokenVocabulary) -> None:
        self._early_dfa = early_dfa
        self.vocab = vocab
        # One thread: a LazyTable's bounds take a millisecond or so; never the pool's thread.
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="gclm-first-mask")
        # One LazyTable per compile, however many requests join it, by its DFA's future
        # (held by the compile's Job while it runs).
        self._built: weakref.WeakKeyDictionary[Future[Any], Future[LazyTable | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._builder.submit(_warm_up, vocab)

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None] | None:
        dfa = self._early_dfa(constraint)
        if dfa is None:
            return None
        with self._lock:
            out = self._built.get(dfa)
            if out is not None:
                return out
            out = self._built[dfa] = Future()
        dfa.add_done_callback(lambda f: self._builder.submit(self._build, f, out))
        return out

    def _build(self, dfa: Future[tuple[Any, Any] | None], out: Future[LazyTable | None]) -> None:
        try:
            arrays = dfa.result()
            out.set_result(None if arrays is None else lazy_table(ByteDfa(*arrays), self.vocab))
        except BaseException as e:  # a bug: the request waits for the table instead
            log.exception("could not build the first masks of a constraint")
            out.set_exception(e)

    def close(self) -> None:
        self._builder.shutdown(wait=False, cancel_futures=True)


def _warm_up(vocab: TokenVocabulary) -> None:
    """The vocabulary's trie and the compiled walks, before the first request: else its
    first state's walk would compile them on the engine's thread, stalling the batch."""
    try:
        table = lazy_table(byte_dfa(_WARM_UP_REGEX), vocab)
        if table is not None:
            table.forward_row(table.initial)
    except Exception:  # not fatal: the first request pays for it instead
        log.exception("could not warm up the first masks")


def lazy_table(dfa: ByteDfa, vocab: TokenVocabulary) -> LazyTable | None:
    """The DFA's LazyTable, or None when it cannot serve it (see the module's docstring)."""
    try:
        table = LazyTable(dfa, vocab)
    except ValueError:
        return None
    if table.upper[table.initial] == UNREACHABLE:
        return None
    return table
