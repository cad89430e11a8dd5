"""The running batch's KV cache: one preallocated buffer per layer, one slot per sequence.

Every attention layer keeps its keys and values in `[slots, kv_heads, capacity, head_dim]`
tensors. A sequence owns one slot from admission to eviction, and its token at position `p`
lives at `[slot, :, p]`. `extend` writes each given slot's new positions in place (a prompt,
one sampled token, or a run of tokens the constraint forced) and attends over the first
`width` positions through a 4D mask built here. Admitting or evicting a sequence touches no
other slot, and a step copies no cache.

A step that extends slots by one token each runs over slots `[0, high)`, `high` one past
the highest slot in use, reading the buffers as views: a slot below it that the step does not
extend (a hole, or a prompt prefilled on another thread) is computed and ignored. A step of
several tokens over some slots only (prefills, drafts with holes) gathers its slots'
positions. `compact()` moves the top row into a hole when no sequence waits to fill it, so an
emptying batch shrinks.

A released slot keeps its positions and the tokens they hold: `claim(prompt)` takes the free
slot whose tokens share the longest prefix with the prompt, or copies that prefix from a slot
in use, so a repeated system prompt or an `n > 1` request is prefilled once.

Capacity grows in chunks (every layer reallocated once, the old positions copied) when a row
needs a position past it. A growth copies every slot of every layer (1.5 GB for 8 slots of
4,096 positions of SmolLM2-135M in float32: seconds on a small CPU), so the engine reserves
what an admitted request may reach (`reserve`) and a long prompt prefilled in chunks grows
the store once, not at every 256th position. And the layers do not all grow in one pass:
a layer grows in the pass that writes past its buffers, or earlier in a pass that has
spent less than `GROWTH_SECONDS` growing layers, so a long prompt admitted beside running
streams spreads the copy over its first chunks' steps instead of freezing the streams for
all of it in one (4.3 s with 28 slots on 2 cores).

Attention runs through the model's own implementation (SDPA or eager): the mask is additive,
0 where a key is visible and the dtype's minimum where not.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from gclm.server.engine.transformers.attention import ATTENTION as CPU_ATTENTION
from gclm.server.engine.transformers.lean import LeanLlama
from gclm.server.engine.transformers.packed import Segment, can_pack, packed_attention_on

# Capacity grows by this many positions at a time.
CHUNK = 256
# Seconds a pass may spend growing layers' buffers before a pass needs them.
GROWTH_SECONDS = 0.05
# Slots planned without --max-batch: as many as hold this many positions each, at most
# MAX_SLOTS; no slot gets fewer than MIN_POSITIONS.
TYPICAL_POSITIONS = 4096
MAX_SLOTS = 64
MIN_POSITIONS = 256
# A prefix shorter than this is prefilled again rather than copied from a slot in use.
MIN_COPIED_PREFIX = 16


@lru_cache(maxsize=16)
def _cache_kwarg(model_type: Any) -> str:
    """The name forward() takes the KV cache under: transformers 5.24 renamed
    `past_key_values` to `cache` (the old name warns, and is due to go in 5.40)."""
    try:
        params = inspect.signature(model_type.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes across every layer of a model."""
    text = _text_config(config)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * text.num_hidden_layers * kv_heads * head_dim * itemsize


def default_kv_memory(device: torch.device) -> int:
    """Bytes the KV cache may take when no --kv-memory is given: half the free memory of a
    GPU (the weights are loaded by then), a quarter of the available memory on the CPU, at
    most 8 GiB there."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    available = _mem_available()
    return min(available // 4, 8 << 30)


def _mem_available() -> int:
    """Available memory: the machine's, or less where a cgroup (a container) limits it."""
    available = 16 << 30  # no /proc (macOS): assume 16 GiB
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


def plan_slots(
    model: Any,
    *,
    context_length: int,
    max_batch: int | None = None,
    memory: int | None = None,
) -> tuple[int, int]:
    """(slots, positions per slot) for a model's KV cache in `memory` bytes (None: the
    default share of free memory).

    With `max_batch` the slots are given and each gets an equal share of the memory; without
    it, as many slots as hold TYPICAL_POSITIONS each (at most MAX_SLOTS: past that, the
    latency of a step grows faster than the batch's throughput, even on a GPU for small
    models). Raises ValueError when a slot would get fewer than MIN_POSITIONS positions.
    """
    param = next(model.parameters())
    per_token = kv_bytes_per_token(model.config, param.dtype)
    budget = memory if memory is not None else default_kv_memory(param.device)
    if max_batch is None:
        typical = min(context_length, TYPICAL_POSITIONS)
        max_batch = max(1, min(MAX_SLOTS, budget // (per_token * typical)))
    positions = min(context_length, budget // (per_token * max_batch))
    if positions < min(context_length, MIN_POSITIONS):
        raise ValueError(
            f"{max_batch} KV slots in {budget >> 20} MiB leave {positions} positions per "
            f"sequence (a token takes {per_token:,} bytes); give the cache more memory "
            "(--kv-memory) or lower --max-batch."
        )
    return max_batch, positions


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class _Plan:
    """What the current forward pass writes and reads.

    `slots` [n] and `positions` [n, q] are where row `rows[i]` of the batch (all rows when
    `rows` is None) writes its keys; the layers return `[:high]` views of the buffers when
    `gather` is None, views of the slots `span` when they are consecutive (a prompt's chunk
    in one slot: no copy of its keys per layer), else the slots `gather` gathered, `width`
    positions wide.
    """

    slots: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor | None
    gather: torch.Tensor | None
    high: int
    width: int
    span: tuple[int, int] | None = None  # consecutive gathered slots [start, stop)
    packed: bool = False  # one row of several slots' tokens: `slots` and `positions` [T]
    need: int = 0  # one past the highest position the pass writes


class _SlotLayer(CacheLayerMixin):
    """One layer's buffers, read and written as the store's plan says."""

    keys: torch.Tensor | None  # declared by transformers' CacheLayerMixin, set here
    values: torch.Tensor | None

    def __init__(self, store: KVStore) -> None:
        super().__init__()
        self.store = store

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """(Re)allocate to the store's capacity, keeping the positions already written."""
        _, heads, _, dim = key_states.shape
        shape = (self.store.slots, heads, self.store.capacity, dim)
        keys, values = key_states.new_zeros(shape), key_states.new_zeros(shape)
        if self.keys is not None and self.values is not None:
            old = self.keys.shape[2]
            keys[:, :, :old] = self.keys
            values[:, :, :old] = self.values
        self.keys, self.values = keys, values
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None or self.store.grows(self.keys.shape[2]):
            started = time.perf_counter()
            self.lazy_initialization(key_states, value_states)
            self.store.growing_s += time.perf_counter() - started
        assert self.keys is not None and self.values is not None
        plan = self.store.plan
        if plan.packed:  # packed.packed_attention reads each slot's own positions
            self.keys[plan.slots, :, plan.positions] = key_states[0].transpose(0, 1)
            self.values[plan.slots, :, plan.positions] = value_states[0].transpose(0, 1)
            return self.keys, self.values
        if plan.rows is not None:
            key_states, value_states = key_states[plan.rows], value_states[plan.rows]
        # [n, 1] slots and [n, q] positions around a slice: the indexed view is [n, q, H, D].
        self.keys[plan.slots[:, None], :, plan.positions] = key_states.transpose(1, 2)
        self.values[plan.slots[:, None], :, plan.positions] = value_states.transpose(1, 2)
        if plan.gather is None:
            high, width = plan.high, plan.width
            return self.keys[:high, :, :width], self.values[:high, :, :width]
        if plan.span is not None:
            start, stop = plan.span
            width = plan.width
            return self.keys[start:stop, :, :width], self.values[start:stop, :, :width]
        keys = self.keys[:, :, : plan.width].index_select(0, plan.gather)
        return keys, self.values[:, :, : plan.width].index_select(0, plan.gather)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.store.plan.width, 0

    def get_seq_length(self) -> int:
        return 0  # positions are always passed explicitly

    def get_max_length(self) -> int:
        return self.store.capacity


class _SlotCache(Cache):
    def __init__(self, store: KVStore, num_layers: int) -> None:
        super().__init__(layers=[_SlotLayer(store) for _ in range(num_layers)])


class KVStore:
    """Slots of preallocated KV cache for one model; see the module docstring.

    `tokens[s]` are the tokens whose keys slot `s` holds, at positions `0..len(tokens[s])-1`
    (kept after release, for prefix reuse); `in_use[s]` whether a sequence owns it.
    """

    def __init__(self, model: Any, slots: int, *, chunk: int = CHUNK, lean: bool = True) -> None:
        """`lean`: decode passes of a Llama run lean.py's forward (the same logits, less
        Python); False runs the model's forward for every pass."""
        if slots < 1:
            raise ValueError(f"A KV store needs at least one slot, not {slots}.")
        self.model = model
        self.slots = slots
        self.chunk = chunk
        self.capacity = 0
        self.growths = 0  # times the capacity was raised (the next pass copies every layer)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.cache = _SlotCache(self, _text_config(model.config).num_hidden_layers)
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.in_use = [False] * slots
        empty = torch.zeros(0, dtype=torch.long)
        self.plan = _Plan(empty, empty[:, None], None, None, 0, 0)
        self.growing_s = 0.0  # seconds the current pass spent growing layers' buffers
        self._cache_kwarg = _cache_kwarg(model.__class__)
        self._lean = LeanLlama.of(model) if lean else None
        self._min = torch.finfo(self.dtype).min
        self._text_config = _text_config(model.config)
        self.packs = can_pack(self._text_config, self.device)  # extend_packed runs
        # attention.use_on switched the model (the engine does, on the CPU)
        self._cpu_attention = (
            getattr(self._text_config, "_attn_implementation", None) == CPU_ATTENTION
        )

    # --- slots ---

    def grows(self, size: int) -> bool:
        """Whether a layer whose buffers hold `size` positions grows in this pass: it must
        (the pass writes past them), or it may (short of capacity, and this pass has not
        spent GROWTH_SECONDS growing others)."""
        if size < self.plan.need:
            return True
        return size < self.capacity and self.growing_s < GROWTH_SECONDS

    def reserve(self, positions: int) -> None:
        """Make room for `positions` positions per slot before they are needed (the buffers
        grow at the next pass); a request's prompt plus max_tokens, at admission."""
        if positions > self.capacity:
            self.capacity = -(-positions // self.chunk) * self.chunk
            self.growths += 1

    @property
    def high(self) -> int:
        """One past the highest slot in use (0 when none is)."""
        return max((s + 1 for s in range(self.slots) if self.in_use[s]), default=0)

    @property
    def free(self) -> int:
        return self.in_use.count(False)

    def claim(self, prompt: list[int]) -> int:
        """A free slot for `prompt`, holding the longest prefix of it this store has (at most
        all but its last token, which must run to give the next token's logits). The slot's
        `tokens` say how much is there; `extend` it with the rest.

        Raises ValueError when every slot is in use.
        """
        free = [s for s in range(self.slots) if not self.in_use[s]]
        if not free:
            raise ValueError("Every KV slot is in use.")
        limit = len(prompt) - 1
        best = max(free, key=lambda s: (min(_common_prefix(self.tokens[s], prompt), limit), -s))
        kept = min(_common_prefix(self.tokens[best], prompt), limit)
        donors = [s for s in range(self.slots) if self.in_use[s]]
        donor = max(donors, key=lambda s: _common_prefix(self.tokens[s], prompt), default=None)
        if donor is not None:
            shared = min(_common_prefix(self.tokens[donor], prompt), limit)
            if shared >= max(kept + 1, MIN_COPIED_PREFIX):
                best, kept = min(free), shared
                self.copy(donor, best, shared)
        self.in_use[best] = True
        del self.tokens[best][kept:]
        return best

    def claim_copy(self, src: int) -> int:
        """The lowest free slot, now in use, holding every position of slot `src`."""
        slot = self.in_use.index(False)
        self.copy(src, slot)
        self.in_use[slot] = True
        return slot

    def reset(self) -> None:
        """Free every slot and forget what they hold (after a failed forward pass)."""
        self.in_use = [False] * self.slots
        self.tokens = [[] for _ in range(self.slots)]

    def release(self, slot: int) -> None:
        """Give the slot back; its positions stay, for a later prompt with the same prefix."""
        self.in_use[slot] = False

    def copy(self, src: int, dst: int, length: int | None = None) -> None:
        """Give slot `dst` the first `length` positions (all, by default) of slot `src`."""
        self.take(self, src, dst, len(self.tokens[src]) if length is None else length)

    def take(self, other: KVStore, src: int, dst: int, length: int) -> None:
        """Give slot `dst` the first `length` positions of slot `src` of `other`, this store
        or another of the same model (a prompt prefilled on a thread of its own:
        side_prefill.py). A layer too short to hold them grows now."""
        self.reserve(length)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            if theirs.keys is None or theirs.values is None or length == 0:
                continue
            if mine.keys is None or mine.keys.shape[2] < length:
                mine.lazy_initialization(theirs.keys, theirs.values)
            assert mine.keys is not None and mine.values is not None
            mine.keys[dst, :, :length] = theirs.keys[src, :, :length]
            mine.values[dst, :, :length] = theirs.values[src, :, :length]
        self.tokens[dst] = other.tokens[src][:length]

    def compact(self) -> tuple[int, int] | None:
        """Move the top row into the lowest free slot below it; returns (from, to), or None
        when there is no hole. Copies that one row's positions in every layer."""
        high = self.high
        hole = next((s for s in range(high) if not self.in_use[s]), None)
        if hole is None:
            return None
        src = high - 1
        self.copy(src, hole)
        self.in_use[hole], self.in_use[src] = True, False
        return src, hole

    # --- forward passes ---

    def extend(self, inputs: dict[int, list[int]], every_position: bool = False) -> torch.Tensor:
        """Append each slot's tokens (a prompt's rest, one sampled token, or a forced run) and
        return the logits after each slot's last token, [n, V], in the order of `inputs`; with
        `every_position`, after each of its tokens, [n, q, V] (q the longest run; a shorter
        run's row is padded with logits to ignore)."""
        given = list(inputs)
        high = self.high
        q = max(len(r) for r in inputs.values())
        # Views of slots [0, high) when every other slot costs one position (a hole, or a
        # slot in use that this pass does not extend: a prompt being prefilled elsewhere),
        # computed and not written.
        whole = max(given) < high and (q == 1 or len(given) == high)
        slots = list(range(high)) if whole else sorted(given)
        runs = [inputs.get(s, [0]) for s in slots]
        starts = torch.tensor([len(self.tokens[s]) if s in inputs else 0 for s in slots])
        width = int(starts.max()) + q
        self.reserve(width)
        ids = torch.tensor([run + [0] * (q - len(run)) for run in runs])  # [n, q], padded
        positions = starts[:, None] + torch.arange(q)[None, :]  # [n, q]
        visible = torch.arange(width)[None, None, :] <= positions[:, :, None]  # [n, q, width]
        written = [i for i, s in enumerate(slots) if s in inputs]
        self.plan = _Plan(
            slots=self._on(torch.tensor([slots[i] for i in written])),
            positions=self._on(positions[written]),
            rows=None if len(written) == len(slots) else self._on(torch.tensor(written)),
            gather=None if whole else self._on(torch.tensor(slots)),
            span=None
            if whole or slots[-1] - slots[0] != len(slots) - 1
            else (slots[0], slots[-1] + 1),
            high=high,
            width=width,
            need=width,
        )
        self.growing_s = 0.0
        last = None if every_position else [len(r) - 1 for r in runs]
        # Prompts that start a slot, all as long: the mask is plain causal, and without one
        # SDPA runs its causal kernel, which skips the blocks above the diagonal (half the
        # attention of a prompt, most of its cost past ~2k tokens).
        fresh = width == q and all(len(r) == q for r in runs)
        logits = self._run(ids, positions, None if fresh else visible, last)
        for s in given:
            self.tokens[s].extend(inputs[s])
        if given == slots:  # the rows are in the order asked for: no copy of [n, (q,) V]
            return logits
        at = {s: i for i, s in enumerate(slots)}
        return logits[self._on(torch.tensor([at[s] for s in given]))]

    def extend_packed(
        self, runs: dict[int, list[int]], rests: dict[int, list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the tokens of `runs` (decoding slots) and `rests` (prompts' chunks) in one
        packed pass (`packed` module; only where `packs`). Returns the logits after each of a
        run's tokens, [R, q, V] (q the longest run; a shorter run's row is padded with
        zeros), and after each rest's last token, [P, V], both in the order given."""
        inputs = {**runs, **rests}
        segments: list[Segment] = []
        slots: list[int] = []
        positions: list[int] = []
        offset = 0
        for slot, tokens in inputs.items():
            start = len(self.tokens[slot])
            segments.append(Segment.of(slot, offset, len(tokens), start, self.dtype))
            slots += [slot] * len(tokens)
            positions += range(start, start + len(tokens))
            offset += len(tokens)
        need = max(s.start + s.length for s in segments)
        self.reserve(need)
        ids = torch.tensor([t for tokens in inputs.values() for t in tokens])[None]
        at = self._on(torch.tensor(positions))
        self.plan = _Plan(
            slots=self._on(torch.tensor(slots)),
            positions=at,
            rows=None,
            gather=None,
            high=self.high,
            width=0,
            packed=True,
            need=need,
        )
        self.growing_s = 0.0
        run_segments = segments[: len(runs)]
        keep = [s.offset + i for s in run_segments for i in range(s.length)]
        keep += [s.offset + s.length - 1 for s in segments[len(runs) :]]
        with packed_attention_on(self._text_config):
            out = self.model(
                input_ids=self._on(ids),
                position_ids=at[None],
                use_cache=True,
                logits_to_keep=self._on(torch.tensor(keep)),
                gclm_segments=tuple(segments),
                **{self._cache_kwarg: self.cache},
            )
        for slot, tokens in inputs.items():
            self.tokens[slot].extend(tokens)
        logits = out.logits[0]  # [len(keep), V]
        q = max((s.length for s in run_segments), default=1)
        decoded = logits.new_zeros((len(runs), q, logits.shape[-1]))
        at = 0
        for i, seg in enumerate(run_segments):
            decoded[i, : seg.length] = logits[at : at + seg.length]
            at += seg.length
        return decoded, logits[at:]

    def _run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor | None,
        last: list[int] | None,
    ) -> torch.Tensor:
        """One forward pass; the logits at index `last[i]` of each row i, [n, V], or (`last`
        None) at every index, [n, q, V]. `visible` None: causal over the run alone."""
        mask = None
        if visible is not None:
            mask = torch.zeros(visible.shape, dtype=self.dtype)
            mask.masked_fill_(~visible, self._min)
        if self._lean is not None and mask is not None and ids.shape[1] == 1:  # a decode pass
            lean = self._lean.forward(
                self._on(ids), self._on(positions), self._on(mask[:, None]), self.cache
            )  # [n, 1, V]
            return lean if last is None else lean[:, 0]
        keep: int | torch.Tensor
        if last is None:
            keep, pick = ids.shape[1], None
        elif ids.shape[1] == 1:
            keep, pick = 1, [0] * len(last)
        else:
            distinct = sorted(set(last))
            keep, pick = self._on(torch.tensor(distinct)), [distinct.index(i) for i in last]
        pick_t = None if pick is None else self._on(torch.tensor(pick))
        # One row of several tokens is one prompt's chunk (or a forced run): its mask is
        # causal, offset by what the slot holds: attention.causal_attention needs no mask.
        prompt = ids.shape[0] == 1 and ids.shape[1] > 1
        extra = {"gclm_prompt": True} if prompt and self._cpu_attention else {}
        out = self.model(
            input_ids=self._on(ids),
            attention_mask=None if mask is None else self._on(mask[:, None]),
            position_ids=self._on(positions),
            use_cache=True,
            logits_to_keep=keep,
            **extra,
            **{self._cache_kwarg: self.cache},
        )
        logits = out.logits  # [n, k, V]
        if pick is None:
            return logits
        rows = torch.arange(len(pick), device=logits.device)
        return logits[rows, pick_t]

    def _on(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)
