"""The continuous-batching engine: one thread, one batched forward pass per step.

A step is a short story (`_step`): admit waiting sequences, run one forward for the running
ones and the admitted prompts (a prompt with more than a few tokens left to prefill gets a
pass of its own: `_one_pass_pays`), then for each position the rows fed: penalise and bias
the rows that ask for it, mask every row with its constraint and budget, sample, read the
logprobs asked for, and update each sequence; evict the finished, and draft the tokens each
row's constraint forces next. Penalties come before the mask, so they can never make an
output invalid; logprobs come after it, so a masked token never appears in them.

The KV cache is a `KVStore`: one slot per sequence in preallocated buffers, so admitting
and evicting touch no other row. Its slot count (the largest batch) comes from the memory
the cache may take (`plan_slots`). A row normally feeds its last sampled token; a row whose
constraint forces the text ahead also feeds the drafted tokens of it (masking/drafts.py),
and keeps each one it samples itself from the logits before it: a forced key costs one
forward pass, not one per token, and the output is the one stepping one token at a time
gives. On the CPU, bfloat16 weights are prepacked for oneDNN once (cpu_linear.py).

A prompt with many tokens left to prefill goes, when it is free, to a thread of its own
(side_prefill.py) that prefills it into a KV store of its own while the steps go on
decoding the running rows; the step after it is done copies it into the prompt's slot and
samples its first token. Other prompts are prefilled a chunk per step, as above
(prefills.py keeps the prompts waiting for their first token).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from gclm.compiler import CompilerPool, TableCache, TokenVocabulary
from gclm.errors import (
    CompileLimitError,
    EngineDeadError,
    GclmError,
    InternalError,
    InvalidRequestError,
)
from gclm.masking import allocate_bitmask
from gclm.masking.apply import MaskRow, mask_rows
from gclm.masking.drafts import Drafter
from gclm.server.engine.constraints import Constraints
from gclm.server.engine.logprobs import token_logprobs
from gclm.server.engine.protocol import EngineStats, GenerationRequest
from gclm.server.engine.shared import TokenizerEngine, TokenizerPrompts
from gclm.server.engine.transformers.admission import AdmissionQueue
from gclm.server.engine.transformers.attention import use_on as cpu_attention_on
from gclm.server.engine.transformers.cpu_linear import pack_linears
from gclm.server.engine.transformers.kv_store import KVStore, plan_slots
from gclm.server.engine.transformers.pace import StepPace
from gclm.server.engine.transformers.penalties import apply_penalties
from gclm.server.engine.transformers.prefills import Prefills
from gclm.server.engine.transformers.sampling import sample
from gclm.server.engine.transformers.sequence import Outbox, Sequence
from gclm.server.engine.transformers.side_prefill import SidePrefill

if TYPE_CHECKING:
    pass

log = logging.getLogger("gclm.engine")

# Most positions a pass with drafts computes over all rows (a row feeds its last token and
# the drafts after it, as many as the batch leaves room for: see _next_feed). Up to about 8
# rows a decode pass costs the same as one row (reading the weights dominates), so drafts
# fill positions that are nearly free; past that each position costs compute, and a batch
# of 8 or more gets no drafts.
DRAFT_TOKENS = 8
# A forward pass costs about what this many more positions in one pass cost (on the CPU, in
# bfloat16: 41 ms for one row, 52 for 8, 129 for 32; bench/prepack.py), so admitted prompts
# join the decode pass when that pads it by no more (`_one_pass_pays`).
PASS_POSITIONS = 16
# Positions one step may compute, decode rows and prompt chunks together, when no
# --max-num-batched-tokens is given (vLLM's flag: a prompt longer than what is left of it
# is prefilled a chunk per step, each step also decoding the running rows). A step is the
# longest a running stream waits between two tokens. On 2 CPU cores, float32, the embedded
# 135M model, a 512-position chunk of a 4k-token prompt takes about 1 s; a GPU does 2,048
# positions of a small model in tens of milliseconds, and vLLM's own default is 2,048.
BATCHED_TOKENS = {"cpu": 512, "cuda": 2048}
DEFAULT_BATCHED_TOKENS = 512


class BatchEngine(TokenizerEngine):
    """Implements gclm.server.engine.protocol.Engine on a transformers causal LM."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        vocab: TokenVocabulary,
        cache: TableCache,
        compiler: CompilerPool | None = None,
        max_batch: int | None = None,
        kv_memory: int | None = None,
        queue_size: int = 64,
        lookup_threads: int = 4,
        draft_tokens: int = DRAFT_TOKENS,
        max_batched_tokens: int | None = None,
        max_step_seconds: float | None = None,
        prefill_thread: bool | None = None,
        lean_decode: bool = True,
    ):
        """`max_batch` None: as many slots as `kv_memory` bytes (None: a share of the free
        memory) hold at a typical length; `queue_size`: sequences that may wait beyond the
        free slots; `draft_tokens` 0: no drafts of forced text; `max_batched_tokens`: the
        positions a step computes (None: BATCHED_TOKENS for the device);
        `max_step_seconds`: while streams decode, prompt chunks small enough that a step
        takes about this long (None: chunks of `max_batched_tokens`; pace.py);
        `prefill_thread`: prefill long prompts on a thread of their own, beside the steps
        (side_prefill.py; None: on a CPU with a core to spare for it); `lean_decode`:
        decode passes of a Llama run lean.py's forward (the same logits, less Python)."""
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.vocab = vocab
        # Cache lookups (a disk read, building mask rows) run on the service's threads;
        # compiles never do, so a cached table is not kept waiting behind them.
        self.constraints = Constraints(vocab, cache, compiler, threads=lookup_threads)
        self.prompts = TokenizerPrompts(tokenizer, vocab, lambda: self.context_length)
        self.queue_size = queue_size
        self.device = next(model.parameters()).device
        if max_batched_tokens is not None and max_batched_tokens < 1:
            raise ValueError(f"max_batched_tokens must be at least 1, got {max_batched_tokens}.")
        self.max_batched_tokens = max_batched_tokens or BATCHED_TOKENS.get(
            self.device.type, DEFAULT_BATCHED_TOKENS
        )
        self.max_step_seconds = max_step_seconds
        self._pace = StepPace(max_step_seconds, self.max_batched_tokens)
        if self.device.type == "cpu":
            _leave_a_core()
            _gqa_in_masked_sdpa()
            packed = pack_linears(model)
            if packed:
                log.info("%d linear layers prepacked for oneDNN (bfloat16)", packed)
            if cpu_attention_on(model):
                log.info("attention in float32 matmuls on the CPU (attention.py), SDPA elsewhere")
        self.eos_ids = _eos_ids(model, tokenizer)
        self.context_length = _context_length(model, tokenizer)
        self.max_batch, self.max_positions = plan_slots(
            model, context_length=self.context_length, max_batch=max_batch, memory=kv_memory
        )
        log.info("KV cache: %d slots of up to %d positions", self.max_batch, self.max_positions)
        self.draft_tokens = draft_tokens
        self._bitmask = allocate_bitmask(self.max_batch, vocab.size)  # [max_batch, W]
        self._drafter = Drafter(vocab.token_bytes)
        self._queue = AdmissionQueue(self.max_batch, queue_size)
        self._running: list[Sequence] = []
        self._kv = KVStore(model, self.max_batch, lean=lean_decode)
        self._slot: dict[Sequence, int] = {}  # the KV slot each sequence owns
        if prefill_thread is None:
            prefill_thread = self.device.type == "cpu" and _spare_core()
        side = SidePrefill(model, self.max_batched_tokens, self._notify) if prefill_thread else None
        self._prefills = Prefills(self._kv, self._slot, side)  # admitted, not yet prefilled
        self._feed: dict[Sequence, list[int]] = {}  # tokens the model has not seen: last, drafts
        self._counts: dict[str, float] = {
            "forward_passes": 0,
            "packed_passes": 0,
            "tokens_sampled": 0,
            "draft_tokens_kept": 0,
            "prefill_tokens": 0,
            "prefill_chunks": 0,
            "steps": 0,
            "step_seconds": 0.0,
        }
        self._last_step = {"last_step_prefill_tokens": 0, "last_step_seconds": 0.0}
        self._wake = self._queue.cond
        self._outbox = Outbox()  # a step's events, handed to the event loop at its end
        self._stopping = False
        self._dead: str | None = None  # why the engine thread died (check_health)
        self._thread = threading.Thread(target=self._run, name="gclm-engine", daemon=True)
        self._thread.start()

    # --- the Engine interface (called from the event loop) ---

    async def start(self) -> None:
        """Nothing to do: the engine thread runs from construction."""

    def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(self._dead)
        if self._stopping:
            raise EngineDeadError("the engine was shut down")

    def submit(self, request: GenerationRequest) -> Sequence:
        self.check_admissible(request)
        if len(request.prompt_ids) + request.params.max_tokens > self.max_positions:
            raise InvalidRequestError(
                f"The prompt ({len(request.prompt_ids)} tokens) plus max_tokens "
                f"({request.params.max_tokens}) exceeds the {self.max_positions} positions "
                "the server's KV cache gives one sequence. Shorten the prompt, lower "
                "max_tokens, or start the server with a smaller --max-batch or a larger "
                "--kv-memory.",
                param="max_tokens",
            )
        seq = Sequence(
            request=request,
            request_id=request.request_id or uuid.uuid4().hex,
            loop=asyncio.get_running_loop(),
            vocab=self.vocab,
            outbox=self._outbox,
        )
        with self._wake:  # under the lock: the thread marks itself dead under it
            self.check_health()
            self._queue.put(seq)
        return seq

    def cancel(self, handle: Sequence) -> None:
        with self._wake:
            handle.cancelled = True
            self._queue.remove(handle)
            self._wake.notify()

    def stats(self) -> EngineStats:
        return self.engine_stats(
            queue_depth=len(self._queue),
            batch_size=len(self._running),
            batch_slots=self.max_batch,
            counters={
                "queue_oldest_wait_seconds": self._queue.oldest_wait(),
                "kv_slots_free": self._queue.free,
                "prefilling": len(self._prefills),
                "max_batched_tokens": self.max_batched_tokens,
                "prefill_chunk_limit": self._pace.chunk(decoding=bool(self._running)),
                "kv_capacity_growths": self._kv.growths,
                **self._counts,
                **self._prefills.counts,
                **self._queue.counts,
                **self._last_step,
            },
        )

    def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)
        self.constraints.close()
        self._prefills.shutdown()

    # --- the engine thread ---

    def _run(self) -> None:
        """The engine thread. `_loop` survives a failed step; what escapes it (the recovery
        itself failing, a BaseException) ends the engine for good: every sequence, and every
        later submit and health check, gets EngineDeadError, so that /health fails and a
        supervisor restarts the server instead of it hanging or answering 500s forever."""
        self._outbox.owner = threading.get_ident()
        try:
            self._loop()
        except BaseException as e:
            log.exception("the engine thread died")
            with self._wake:
                self._dead = f"engine thread failed: {e!r}"
                orphans = [*self._queue.drain(), *self._running, *self._prefills.abandon()]
                self._running = []
            for seq in orphans:
                seq.fail(EngineDeadError(self._dead))
        finally:
            self._outbox.owner = None  # later events (none expected) go at once
            self._outbox.flush()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._wake:
                while not self._stopping and not self._queue and not self._busy:
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self._step()
            except Exception as e:  # a bug or an out-of-memory: fail the batch, keep serving
                log.exception("engine step failed")
                error = (
                    e if isinstance(e, GclmError) else InternalError(f"Generation failed: {e!r}")
                )
                for seq in (*self._running, *self._prefills.abandon()):
                    seq.fail(error)
                self._running = []
                self._slot.clear()
                self._feed.clear()
                self._kv.reset()
                self._queue.free = self.max_batch
            finally:
                self._outbox.flush()  # one hand-off of the step's events to each loop

    @property
    def _busy(self) -> bool:
        """Whether a step has work: rows, or prompts (a prompt on the side thread wakes the
        engine thread when it is done: `_notify`)."""
        return bool(self._running) or self._prefills.busy

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify()

    @torch.inference_mode()
    def _step(self) -> None:
        started = time.perf_counter()
        self._evict([s for s in self._running if s.cancelled])
        self._drop_cancelled()
        self._admit()
        self._counts["prefill_tokens"] += self._prefills.start_side()
        chunks = self._schedule()
        fed, logits, ready = self._forward(chunks)  # [B, q, V] for running + ready rows
        self._running = running = self._running + ready
        done: list[Sequence] = []
        rows = list(range(len(running)))
        for position in range(logits.shape[1]):
            if not rows:
                break
            seqs = [running[i] for i in rows]
            step = _rows_at(logits, rows, position)  # [b, V] float32, written in place
            apply_penalties(step, seqs)  # before the mask: output stays valid
            failed = self._mask(step, seqs)
            tokens = sample(step, seqs)  # [b]
            logprobs = token_logprobs(step, tokens, seqs, self.token_names)  # after the mask
            kept, feeds = [], []
            for j, (i, seq, t, lp) in enumerate(zip(rows, seqs, tokens, logprobs, strict=True)):
                drafts = fed.get(seq, [])[1:]
                if j in failed:  # its mask source passed a limit: this row ends, not the batch
                    seq.fail(failed[j])
                    done.append(seq)
                elif seq.update(t, self.eos_ids, lp):
                    done.append(seq)
                elif position < len(drafts) and t == drafts[position]:
                    kept.append(i)  # the next position's logits follow from this token
                else:
                    feeds.append((seq, t, len(drafts) - position))
            # The tokens go to their streams before the drafts are written: a draft may
            # grow its state's row first (milliseconds at 200k tokens), which held a new
            # schema's first token back (+5 ms at the median over HTTP).
            if self.draft_tokens and any(s.constraint_state is not None for s, _, _ in feeds):
                self._outbox.flush()
            for seq, t, unseen in feeds:
                self._next_feed(seq, t, unseen=unseen)
            self._counts["tokens_sampled"] += len(seqs)
            self._counts["draft_tokens_kept"] += len(kept)
            rows = kept
        self._evict(done)
        self._compact()
        self._record(chunks, bool(fed), time.perf_counter() - started)

    def _admit(self) -> None:
        """Give waiting sequences the free slots: a distinct prompt a slot holding as much
        of it as the store has (the rest is prefilled a chunk per step), another choice of
        a prompt being prefilled the promise of a copy of that slot once it is."""
        for seq in self._queue.take(self._kv.free - len(self._prefills.followers)):
            self._prefills.admit(seq)
        self._publish_free()

    def _schedule(self) -> dict[Sequence, int]:
        """How many of its prompt's tokens each prefilling sequence feeds this step, oldest
        first: the positions the running rows' feeds leave of `max_batched_tokens`, at
        most the chunk that keeps a step with running rows near `max_step_seconds`."""
        left = self.max_batched_tokens - sum(map(len, self._feed.values()))
        remaining = self._prefills.remaining
        left = min(left, self._pace.chunk(decoding=bool(self._running), remaining=remaining))
        return self._prefills.schedule(left)

    def _forward(
        self, chunks: dict[Sequence, int]
    ) -> tuple[dict[Sequence, list[int]], torch.Tensor, list[Sequence]]:
        """Feed every running row its unseen tokens and each prefilling prompt its chunk,
        in one pass when that pays (`_one_pass_pays`), else a decode pass and a prefill
        pass. Returns what each running row was fed, logits [B, q, V] (row i's logits after
        each of its tokens; a prompt prefilled in full, by this pass or by the side thread,
        and each choice copying its slot: after the prompt, at position 0), and the
        sequences whose prompt is now in full."""
        fed = {seq: self._feed.pop(seq) for seq in self._running}
        runs = {self._slot[seq]: tokens for seq, tokens in fed.items()}
        rests = self._prefills.take(chunks)
        decoded = prefilled = None
        if runs and rests and _one_pass_pays(runs, rests):
            logits = self._kv.extend({**runs, **rests}, every_position=True)
            decoded = logits[: len(runs)]
            last = torch.tensor([len(rest) - 1 for rest in rests.values()], device=logits.device)
            prefilled = logits[len(runs) :][torch.arange(len(rests), device=logits.device), last]
            self._counts["forward_passes"] += 1
        elif runs and rests and self._kv.packs and self._prefills.packs:
            decoded, prefilled = self._kv.extend_packed(runs, rests)
            self._counts["forward_passes"] += 1
            self._counts["packed_passes"] += 1
        else:
            if runs:
                decoded = self._kv.extend(runs, every_position=True)
            if rests:
                prefilled = self._kv.extend(rests)  # [P, V]
            self._counts["forward_passes"] += bool(runs) + bool(rests)
        parts = [] if decoded is None else [decoded]
        ready, rows = self._prefills.finished(chunks)
        news = []
        if ready:
            assert prefilled is not None
            news.append(prefilled[rows])  # [A, V]
        side, failed = self._prefills.collect_side()
        self._evict(failed)
        if side:
            ready += [seq for seq, _ in side]
            news.append(torch.stack([row for _, row in side]))
        if news:
            new = (news[0] if len(news) == 1 else torch.cat(news))[:, None]  # [A, 1, V]
            if parts and parts[0].shape[1] > 1:
                new = new.expand(-1, parts[0].shape[1], -1)  # only position 0 is read
            parts.append(new)
        if not parts:  # a chunk that did not finish its prompt, nothing running
            return fed, torch.empty(0, 1, 0), []
        return fed, parts[0] if len(parts) == 1 else torch.cat(parts), ready

    def _drop_cancelled(self) -> None:
        """Forget cancelled choices waiting on a prompt, and cancelled prompts no live
        choice waits on."""
        self._evict(self._prefills.drop_cancelled())

    def _record(self, chunks: dict[Sequence, int], decoding: bool, seconds: float) -> None:
        tokens = sum(chunks.values())
        self._pace.observe(tokens, decoding, seconds)
        self._counts["prefill_tokens"] += tokens
        self._counts["prefill_chunks"] += len(chunks)
        self._counts["steps"] += 1
        self._counts["step_seconds"] += seconds
        self._last_step = {"last_step_prefill_tokens": tokens, "last_step_seconds": seconds}

    def _publish_free(self) -> None:
        """Tell the queue how many slots no sequence holds or was promised."""
        with self._wake:
            self._queue.free = self._kv.free - len(self._prefills.followers)

    def _next_feed(self, seq: Sequence, token: int, unseen: int) -> None:
        """What `seq` feeds next: `token`, then the drafts of what its constraint forces.
        The `unseen` drafts it was fed but did not sample are dropped from its slot."""
        slot = self._slot[seq]
        if unseen > 0:
            del self._kv.tokens[slot][-unseen:]
        feed = [token]
        state = seq.constraint_state
        if state is not None and self.draft_tokens:
            # A pass feeds every row as many tokens as the longest feed (DRAFT_TOKENS).
            limit = self.draft_tokens // max(1, len(self._running))
            with contextlib.suppress(CompileLimitError):  # the next mask fails the row
                feed += self._drafter.draft(state, seq.tokens_left, limit - 1)
        self._feed[seq] = feed

    def _mask(self, logits: torch.Tensor, seqs: list[Sequence]) -> dict[int, CompileLimitError]:
        """Mask each row to its constraint; the rows whose mask source passed one of its
        limits (by index: to be failed), unmasked."""
        if all(seq.constraint_state is None for seq in seqs):
            # What mask_rows would do for free rows alone: every token allowed, the model's
            # padded output columns (no token has their ids) not.
            if logits.shape[-1] > self.vocab.size:
                logits[:, self.vocab.size :] = -torch.inf
            return {}
        rows = [
            MaskRow.free()
            if seq.constraint_state is None
            else MaskRow(
                seq.constraint_state,
                seq.tokens_left,
                seq.request.params.max_tokens,
                seq.request.constraint.policy if seq.request.constraint else None,
            )
            for seq in seqs
        ]
        failed: dict[int, CompileLimitError] = {}
        mask_rows(logits, self._bitmask, rows, self.vocab.size, failed)
        return failed

    def _evict(self, done: list[Sequence]) -> None:
        if not done:
            return
        gone = set(done)
        for seq in done:
            slot = self._slot.pop(seq, None)
            if slot is not None:
                self._kv.release(slot)
            self._feed.pop(seq, None)
            if seq.cancelled and not seq.finished:
                seq.finish("cancelled")
            else:
                self._queue.finished(seq)
        self._running = [s for s in self._running if s not in gone]
        self._publish_free()

    def _compact(self) -> None:
        """With nobody waiting to fill a freed slot, move the top row into it."""
        if self._queue:
            return
        moved = self._kv.compact()
        if moved is not None:
            src, dst = moved
            seq = next(s for s, slot in self._slot.items() if slot == src)
            self._slot[seq] = dst


@cache  # once per process: a second engine must not take away another core
def _leave_a_core() -> None:
    """Run the model on one core fewer than torch would, unless OMP_NUM_THREADS is set.

    The event loop (HTTP, SSE, detokenized text) and the compile workers need a core too.
    OpenMP's intra-op threads wait for each other at every op, so when one of them is
    descheduled the whole forward stalls: on 2 busy cores, 2 threads decoded a batch of 8
    ~13x slower than 1 thread (1.6 s against 0.12 s per step).
    """
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, torch.get_num_threads() - 1))
        log.info("%d intra-op thread(s); set OMP_NUM_THREADS to choose", torch.get_num_threads())


@cache
def _gqa_in_masked_sdpa() -> None:
    """Let SDPA share each key/value head among its query heads when a mask is passed too,
    unless TRANSFORMERS_SDPA_FORCE_GQA is set.

    transformers repeats the key/value heads into a copy for every masked pass (it keeps
    `enable_gqa` for unmasked ones: CUDA's fast kernels take no mask with it), and every
    chunk of a long prompt after its first is masked: that copies the slot's whole cache
    in every layer, a cost that grows with the prompt. On the CPU, torch's SDPA takes the
    mask with `enable_gqa`, with the same logits (tested). Measured on 2 cores, a
    4,000-token prompt beside six decoding streams: first token 38.0 -> 33.3 s, the
    streams' largest gap 3.5 -> 2.1 s (bench/load.py, scenario a).
    """
    os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")


def _spare_core() -> bool:
    """Whether the cores this process may use hold a second set of the model's intra-op
    threads (a prompt prefilled beside the steps: side_prefill.py)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity else (os.cpu_count() or 1)
    return 2 * torch.get_num_threads() <= cores


def _rows_at(logits: torch.Tensor, rows: list[int], position: int) -> torch.Tensor:
    """`logits[rows, position]` in float32, to be masked and sampled in place: a view of
    `logits` when that is every row in order and already float32 (no [B, V] copy; the
    logits are not read again), else a copy."""
    if logits.dtype == torch.float32 and len(rows) == logits.shape[0]:  # rows: 0, 1, ...
        return logits[:, position]
    return logits[rows, position].float()


def _one_pass_pays(runs: dict[int, list[int]], rests: dict[int, list[int]]) -> bool:
    """Whether the prompts' rests should join the decode pass. A pass is a rectangle (rows x
    the longest run), so a long rest pads every decode row to its length; a pass of its own
    costs the weights read once more, about PASS_POSITIONS positions' worth. A prompt whose
    prefix a slot kept (a repeated prompt) usually has one or two tokens left: it joins."""
    merged = (len(runs) + len(rests)) * max(len(r) for r in (*runs.values(), *rests.values()))
    apart = len(runs) * max(map(len, runs.values())) + len(rests) * max(map(len, rests.values()))
    return merged <= apart + PASS_POSITIONS


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return frozenset(i for i in ids if i is not None)


def _context_length(model: Any, tokenizer: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return int(min(getattr(tokenizer, "model_max_length", 2048), 1 << 20))
