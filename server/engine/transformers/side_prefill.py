"""A long prompt prefilled on a thread of its own, beside the engine's steps.

On a CPU the engine runs the model on one intra-op thread and leaves a core (engine.py:
`_leave_a_core`). Chunked prefill on the engine thread makes every running stream wait for
each chunk: on 2 cores without AVX2, a step that only decodes six rows takes 0.2-0.25 s (it
reads every weight), and a step near the end of a 4k-token prompt needs about 1 s of prompt
tokens beside it to keep the prompt's first token within 1.3x of unchunked, so the streams'
gaps stay above 1 s whatever the pace (pace.py). `SidePrefill` runs one prompt's prefill on
a second thread instead, into a KV store of its own (one slot, made anew for each prompt:
the keys of the prompt it holds are memory past --kv-memory), while the engine thread
goes on stepping the running rows: torch releases the GIL inside its ops, so the two
threads run on two cores. Measured on 2 cores, float32, the embedded model (bench/load.py,
scenario a): six streams' largest gap while a 4,000-token prompt is prefilled 0.38-0.41 s,
against 1.69-1.83 s for chunks on the engine thread.

The engine thread starts a prompt (`start`: its slot's cached prefix is copied over first)
and, once the thread is done, adopts it (`collect`: the prompt's positions are copied into
the engine's slot, and its last logits give the first token). The thread touches nothing
the engine thread uses but the model's weights, which no one writes; while it runs, the
engine thread runs no packed pass (packed.py switches the model's attention function for
the duration of a pass, and the thread would see it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from gclm.server.engine.transformers.kv_store import KVStore
from gclm.server.engine.transformers.sequence import Sequence

log = logging.getLogger("gclm.engine")

# A prompt with at least this many tokens left to prefill goes to the thread when it is
# free. A shorter one fits a step or two beside the decoding rows (about 3 ms a token on 2
# cores), in the packed pass that the thread's prompt would rule out while it runs.
SIDE_MIN_TOKENS = 128


class SidePrefill:
    """One prompt at a time prefilled on a thread of its own (module docstring)."""

    def __init__(self, model: Any, chunk: int, on_done: Callable[[], None]) -> None:
        """`chunk`: the prompt tokens one forward pass of the thread feeds (a cancelled
        prompt stops after the pass it is in); `on_done`: called on the thread when a
        prompt is done (wakes the engine thread)."""
        self.model = model
        self.store = KVStore(model, 1)  # a new one per prompt: an idle thread holds no keys
        self.chunk = chunk
        self.seq: Sequence | None = None  # the prompt being prefilled, until collected
        self.started = 0.0
        self._on_done = on_done
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gclm-prefill")
        self._future: Future[torch.Tensor | None] | None = None
        self._stop = threading.Event()

    @property
    def free(self) -> bool:
        """Whether a prompt may start: none is held, and an abandoned one has stopped."""
        return self.seq is None and (self._future is None or self._future.done())

    @property
    def running(self) -> bool:
        """Whether the thread is in a forward pass or about to be (packed passes wait)."""
        return self._future is not None and not self._future.done()

    @property
    def finished(self) -> bool:
        """Whether the held prompt is done and waits to be collected."""
        return self.seq is not None and self._future is not None and self._future.done()

    def start(self, seq: Sequence, kv: KVStore, slot: int, rest: list[int]) -> None:
        """Prefill `rest`, the tokens of `seq`'s prompt past what slot `slot` of `kv` holds
        (copied over first: the thread never reads `kv`)."""
        assert self.free
        kept = len(kv.tokens[slot])
        self.store.in_use[0] = True
        self.store.reserve(kept + len(rest))
        self.store.take(kv, slot, 0, kept)
        self.seq, self.started = seq, time.perf_counter()
        self._stop.clear()
        self._future = self._pool.submit(self._prefill, self.store, list(rest))
        self._future.add_done_callback(lambda _: self._on_done())

    def collect(self, kv: KVStore, slot: int) -> torch.Tensor:
        """The logits after the held prompt's last token, [V], once `finished`; its
        positions are now slot `slot`'s of `kv`. Raises what the thread raised."""
        assert self.finished and self._future is not None
        self.seq = None
        store, self.store = self.store, KVStore(self.model, 1)
        logits = self._future.result()
        assert logits is not None  # only an abandoned prompt stops early
        kv.take(store, 0, slot, len(store.tokens[0]))
        return logits

    def abandon(self) -> Sequence | None:
        """Stop the held prompt after the pass it is in, and forget it (a cancelled
        request, a failed step); returns it."""
        seq, self.seq = self.seq, None
        self._stop.set()
        self.store = KVStore(self.model, 1)
        return seq

    def shutdown(self) -> None:
        self._stop.set()
        self.seq = None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _prefill(self, store: KVStore, rest: list[int]) -> torch.Tensor | None:
        """The thread: feed `rest` to slot 0 of `store` a chunk per pass; the logits after
        its last token."""
        logits = None
        with torch.inference_mode():
            for i in range(0, len(rest), self.chunk):
                if self._stop.is_set():
                    return None
                logits = store.extend({0: rest[i : i + self.chunk]})  # [1, V]
        assert logits is not None
        return logits[0]
