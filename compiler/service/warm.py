"""Imported once by the compile workers' fork server, so that each worker forks warm.

A worker started from scratch imports numpy, numba and outlines-core and loads the index
reader's compiled code: 1.3 s on an idle core and 5 s or more on a loaded machine, during
which the requests it was started for wait. The fork server (compiler/service/pool.py) imports this
module once and forks every worker from it, already warm.
"""

from __future__ import annotations

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import GclmError


def _warm() -> None:
    # A three-token vocabulary: loads (or compiles) every numba function of the reader and
    # of the token walk.
    vocab = TokenVocabulary((b"a", b"b", b"ab", None), 3, "plain")
    try:
        compile_constraint(Constraint.regex("(ab|a)b?"), vocab)
    except GclmError:  # never expected; a cold worker is only slower
        pass


_warm()

if __name__ == "__main__":
    # `python -m gclm.compiler.service.warm` (the Docker image's build): the functions the server
    # grows first masks with, too, into numba's cache. They compile for array types, not
    # for a vocabulary, so a small one loads them for any.
    from gclm.compiler.service.first_mask import warm_up

    words = [bytes([b]) for b in range(256)] + [b"ab", b"abc", b'{"', b'":']
    warm_up(TokenVocabulary((*words, None), len(words), "plain"))
