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
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import torch

from gclm.compiler.cache import TableCache
from gclm.compiler.constraint import Constraint
from gclm.compiler.pool import CompilerPool
from gclm.compiler.tables import CompiledTable
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.errors import GclmError, InternalError, InvalidRequestError, QueueFullError
from gclm.masking import (
    allocate_bitmask,
    apply_bitmask,
    check_budget,
    fill_bitmask,
    fill_unconstrained,
    mask_table,
)
from gclm.masking.drafts import Drafter
from gclm.masking.graceful import GracefulPolicy
from gclm.masking.policy import BudgetPolicy
from gclm.server.engine.protocol import GenerationRequest, StreamEvent, until_done
from gclm.server.engine.transformers.cpu_linear import pack_linears
from gclm.server.engine.transformers.kv_store import KVStore, plan_slots
from gclm.server.engine.transformers.logprobs import TokenNames, token_logprobs
from gclm.server.engine.transformers.penalties import apply_penalties
from gclm.server.engine.transformers.sampling import sample
from gclm.server.engine.transformers.sequence import Sequence

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


class BatchEngine:
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
    ):
        """`max_batch` None: as many slots as `kv_memory` bytes (None: a share of the free
        memory) hold at a typical length; `draft_tokens` 0: no drafts of forced text."""
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.vocab = vocab
        self.cache = cache
        self.compiler = compiler  # only read for /metrics: the cache submits to it
        self.queue_size = queue_size
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":
            _leave_a_core()
            packed = pack_linears(model)
            if packed:
                log.info("%d linear layers prepacked for oneDNN (bfloat16)", packed)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.context_length = _context_length(model, tokenizer)
        self.max_batch, self.max_positions = plan_slots(
            model, context_length=self.context_length, max_batch=max_batch, memory=kv_memory
        )
        log.info("KV cache: %d slots of up to %d positions", self.max_batch, self.max_positions)
        self.draft_tokens = draft_tokens
        # Logprobs name a special token (no bytes) as the tokenizer does, e.g. <|im_end|>.
        self._names = TokenNames(vocab.token_bytes, tokenizer.convert_ids_to_tokens)
        # No token spells more than `longest` bytes (nor characters), so a text longer than
        # this has more tokens than the context holds: refused before it is tokenized.
        longest = max((len(b) for b in vocab.token_bytes if b), default=1)
        self.max_prompt_chars = self.context_length * longest
        self._bitmask = allocate_bitmask(self.max_batch, vocab.size)  # [max_batch, W]
        self._graceful = GracefulPolicy.for_vocab(vocab.token_bytes)
        self._drafter = Drafter(vocab.token_bytes)
        # Cache lookups (a disk read, building mask rows) run here; compiles never do, so a
        # cached table is not kept waiting behind them (compiler/pool.py runs compiles).
        self._lookups = ThreadPoolExecutor(lookup_threads, thread_name_prefix="gclm-lookup")
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._kv = KVStore(model, self.max_batch)
        self._slot: dict[Sequence, int] = {}  # the KV slot each running sequence owns
        self._feed: dict[Sequence, list[int]] = {}  # tokens the model has not seen: last, drafts
        self._counts = {"forward_passes": 0, "tokens_sampled": 0, "draft_tokens_kept": 0}
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gclm-engine", daemon=True)
        self._thread.start()

    # --- the Engine interface (called from the event loop) ---

    async def compile(self, constraint: Constraint) -> CompiledTable:
        loop = asyncio.get_running_loop()
        future = await loop.run_in_executor(self._lookups, self.cache.fetch, constraint)
        # shield: a client that leaves must not cancel the compile other requests share.
        table = await asyncio.shield(asyncio.wrap_future(future))
        # Build the mask rows here, not on the engine thread's first step (a cache that
        # measures with masking.masks.table_memory has built them already).
        await loop.run_in_executor(self._lookups, mask_table, table)
        return table

    def encode_prompt(self, prompt: str) -> list[int]:
        self._check_chars(len(prompt), "prompt")
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        self._check_chars(sum(len(str(m.get("content", ""))) for m in messages), "messages")
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **template_kwargs
            )
        except Exception as e:  # the template's own checks (roles, order)
            raise InvalidRequestError(
                f"The model's chat template rejected the messages: {e}", param="messages"
            ) from e

    def budget_policy(self, name: str) -> BudgetPolicy | None:
        return self._graceful if name == "graceful" else None

    def _check_chars(self, chars: int, param: str) -> None:
        if chars > self.max_prompt_chars:
            raise InvalidRequestError(
                f"The {param} has {chars:,} characters, more than fit in the model's context "
                f"of {self.context_length} tokens. Shorten it.",
                param=param,
                code="context_length_exceeded",
            )

    def submit(self, request: GenerationRequest) -> Sequence:
        total = len(request.prompt_ids) + request.params.max_tokens
        if not request.prompt_ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if total > self.context_length:
            raise InvalidRequestError(
                f"The prompt ({len(request.prompt_ids)} tokens) plus max_tokens "
                f"({request.params.max_tokens}) exceeds the model's context of "
                f"{self.context_length} tokens. Shorten the prompt or lower max_tokens.",
                param="max_tokens",
            )
        if total > self.max_positions:
            raise InvalidRequestError(
                f"The prompt ({len(request.prompt_ids)} tokens) plus max_tokens "
                f"({request.params.max_tokens}) exceeds the {self.max_positions} positions "
                "the server's KV cache gives one sequence. Shorten the prompt, lower "
                "max_tokens, or start the server with a smaller --max-batch or a larger "
                "--kv-memory.",
                param="max_tokens",
            )
        table = request.table
        if table is not None and request.budget_aware:
            check_budget(table, request.params.max_tokens, thinking=request.thinking)
        if max(request.prompt_ids) >= self.vocab.size or min(request.prompt_ids) < 0:
            raise InvalidRequestError(
                f"Prompt token ids must be in [0, {self.vocab.size}).", param="prompt"
            )
        for token, _ in request.params.logit_bias:
            if not 0 <= token < self.vocab.size:
                raise InvalidRequestError(
                    f"logit_bias names token {token}; token ids are in [0, {self.vocab.size}).",
                    param="logit_bias",
                )
        seq = Sequence(
            request=request,
            request_id=request.request_id or uuid.uuid4().hex,
            loop=asyncio.get_running_loop(),
            vocab=self.vocab,
        )
        with self._wake:
            if len(self._waiting) >= self.queue_size:
                raise QueueFullError(self.queue_size, retry_after=1.0)
            self._waiting.append(seq)
            self._wake.notify()
        return seq

    def stream(self, handle: Sequence) -> AsyncIterator[StreamEvent]:  # type: ignore[override]
        return until_done(handle.events)

    def cancel(self, handle: Sequence) -> None:
        with self._wake:
            handle.cancelled = True
            if handle in self._waiting:
                self._waiting.remove(handle)
            self._wake.notify()

    def stats(self) -> dict[str, float]:
        s = self.cache.stats
        out: dict[str, float] = {
            "queue_depth": len(self._waiting),
            "batch_size": len(self._running),
            "batch_slots": self.max_batch,
            **self._counts,
            "cache_hits": s.hits + s.negative_hits + s.disk_hits,
            "cache_misses": s.misses - s.disk_hits,
        }
        out.update(self.cache.gauges())
        if self.compiler is not None:
            out.update(self.compiler.gauges())
        return out

    def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)
        self._lookups.shutdown(wait=False, cancel_futures=True)

    # --- the engine thread ---

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and not self._running:
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
                for seq in self._running:
                    seq.fail(error)
                self._running = []
                self._slot.clear()
                self._feed.clear()
                self._kv.reset()

    @torch.inference_mode()
    def _step(self) -> None:
        self._evict([s for s in self._running if s.cancelled])
        admitted = self._admit()
        running = self._running
        fed, logits = self._forward(admitted)  # [B, q, V] for running + admitted rows
        self._running = running = running + admitted
        done: list[Sequence] = []
        rows = list(range(len(running)))
        for position in range(logits.shape[1]):
            if not rows:
                break
            seqs = [running[i] for i in rows]
            step = logits[rows, position].float()  # [b, V]
            apply_penalties(step, seqs)  # before the mask: output stays valid
            self._mask(step, seqs)
            tokens = sample(step, seqs)  # [b]
            logprobs = token_logprobs(step, tokens, seqs, self._names)  # after the mask
            kept = []
            for i, seq, t, lp in zip(rows, seqs, tokens, logprobs, strict=True):
                drafts = fed.get(seq, [])[1:]
                if seq.update(t, self.eos_ids, lp):
                    done.append(seq)
                elif position < len(drafts) and t == drafts[position]:
                    kept.append(i)  # the next position's logits follow from this token
                else:
                    self._next_feed(seq, t, unseen=len(drafts) - position)
            self._counts["tokens_sampled"] += len(seqs)
            self._counts["draft_tokens_kept"] += len(kept)
            rows = kept
        self._evict(done)
        self._compact()

    def _admit(self) -> list[Sequence]:
        with self._wake:
            room = self._kv.free
            admitted = []
            while room > 0 and self._waiting:
                seq = self._waiting.popleft()
                if not seq.cancelled:
                    admitted.append(seq)
                    room -= 1
        return admitted

    def _forward(self, admitted: list[Sequence]) -> tuple[dict[Sequence, list[int]], torch.Tensor]:
        """Feed every running row its unseen tokens and prefill the admitted prompts (one
        prefill per distinct prompt: the n choices of a request share theirs), in one pass
        when that pays (`_one_pass_pays`), else a decode pass and a prefill pass. Returns
        what each running row was fed, and logits [B, q, V]: row i's logits after each of
        its tokens (admitted rows: after the prompt, at position 0)."""
        fed = {seq: self._feed.pop(seq) for seq in self._running}
        runs = {self._slot[seq]: tokens for seq, tokens in fed.items()}
        rests, leaders = self._claim(admitted)
        decoded = prefilled = None
        if runs and rests and _one_pass_pays(runs, rests):
            logits = self._kv.extend({**runs, **rests}, every_position=True)
            decoded = logits[: len(runs)]
            last = torch.tensor([len(rest) - 1 for rest in rests.values()], device=logits.device)
            prefilled = logits[len(runs) :][torch.arange(len(rests), device=logits.device), last]
            self._counts["forward_passes"] += 1
        else:
            if runs:
                decoded = self._kv.extend(runs, every_position=True)
            if rests:
                prefilled = self._kv.extend(rests)  # [P, V]
            self._counts["forward_passes"] += bool(runs) + bool(rests)
        parts = [] if decoded is None else [decoded]
        if admitted:
            assert prefilled is not None
            for seq, leader in leaders.items():  # the n choices of a prompt copy its slot
                self._slot[seq] = self._kv.claim_copy(leader)
            order = list(rests)
            new = prefilled[[order.index(leaders.get(seq, self._slot[seq])) for seq in admitted]]
            new = new[:, None]  # [A, 1, V]
            if parts and parts[0].shape[1] > 1:
                new = new.expand(-1, parts[0].shape[1], -1)  # only position 0 is read
            parts.append(new)
        return fed, torch.cat(parts)

    def _claim(self, admitted: list[Sequence]) -> tuple[dict[int, list[int]], dict[Sequence, int]]:
        """Give each distinct admitted prompt a slot (holding as much of it as the store
        has): returns each such slot's missing tokens, and for the other choices of the same
        prompt the slot to copy once it is prefilled."""
        rests: dict[int, list[int]] = {}
        slot_of: dict[tuple[int, ...], int] = {}
        leaders: dict[Sequence, int] = {}
        for seq in admitted:
            prompt = seq.request.prompt_ids
            if tuple(prompt) in slot_of:
                leaders[seq] = slot_of[tuple(prompt)]
                continue
            slot = self._slot[seq] = slot_of[tuple(prompt)] = self._kv.claim(prompt)
            rests[slot] = prompt[len(self._kv.tokens[slot]) :]
        return rests, leaders

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
            feed += self._drafter.draft(state, seq.tokens_left, limit - 1)
        self._feed[seq] = feed

    def _mask(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for row, seq in enumerate(seqs):
            if seq.constraint_state is None:
                fill_unconstrained(self._bitmask, row, self.vocab.size)
            else:
                fill_bitmask(self._bitmask, row, seq.constraint_state, seq.tokens_left)
        apply_bitmask(logits, self._bitmask[: len(seqs)])
        for row, seq in enumerate(seqs):
            state, policy = seq.constraint_state, seq.request.policy
            if policy is not None and state is not None and state.budget_aware:
                policy.adjust(logits[row], state, seq.tokens_left, seq.request.params.max_tokens)

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
        self._running = [s for s in self._running if s not in gone]

    def _compact(self) -> None:
        """With nobody waiting to fill a freed slot, move the top row into it."""
        if self._waiting:
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
