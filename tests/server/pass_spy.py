"""A fixture that records the KV store's forward passes (the engine tests)."""

from __future__ import annotations

import pytest

from gclm.server.engine.transformers.kv_store import KVStore


class Packed(dict):
    """A packed pass's slots and token counts (KVStore.extend_packed), in the `passes` list."""


@pytest.fixture
def passes(monkeypatch):
    """The slots and token counts of every forward pass the KV store runs, a packed pass's
    as a `Packed`."""
    seen: list[dict[int, int]] = []
    extend, extend_packed = KVStore.extend, KVStore.extend_packed

    def spy(self, inputs, every_position=False):
        seen.append({slot: len(tokens) for slot, tokens in inputs.items()})
        return extend(self, inputs, every_position)

    def spy_packed(self, runs, rests):
        seen.append(Packed({slot: len(tokens) for slot, tokens in (runs | rests).items()}))
        return extend_packed(self, runs, rests)

    monkeypatch.setattr(KVStore, "extend", spy)
    monkeypatch.setattr(KVStore, "extend_packed", spy_packed)
    return seen
