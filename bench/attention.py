"""The engine's attention on the CPU: SDPA as the engine called it vs attention.py, side by side.

    python -m bench.attention [--sizes 1024 2048 4096] [--batches 1 8 16]
                              [--dtypes bfloat16 float32] [--repeats N] [--no-model]
                              [--json PATH]

On one intra-op thread (the engine's on 2 cores), in one process, the two taking turns
`--repeats` times (medians):

    layer     one layer's attention over a prompt of each size fed in chunks of 512
              (the CPU's token budget): SDPA as the engine called it (the first chunk
              causal, later ones with an additive mask, key/value heads shared) against
              attention.causal_attention, on random inputs of the embedded model's
              shapes (9 query heads over 3 key/value heads of 64); ms, their ratio, and
              each one's mean and largest error against float64.
    prefill   the embedded SmolLM2-135M-Instruct prefilling each prompt through a KVStore
              as the engine does (its linear layers prepacked in bfloat16, chunks of 512),
              the model's attention switched between transformers' "sdpa" and
              attention.py's: seconds to the last chunk's logits, their ratio, and each
              one's largest difference from the float32 model's final logits (SDPA), with
              whether its top token is float32's.
    decode    the same model decoding `--batches` rows (prompts of 150-250 tokens) through
              a KVStore, one token a row a step, the attention switched as above: ms per
              step (the median of 8 steps), their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from gclm.server.engine.model_loader import load_model
from gclm.server.engine.transformers.attention import ATTENTION, causal_attention

# As the engine sets it on the CPU (engine._gqa_in_masked_sdpa): SDPA shares key/value heads
# in masked passes too.
os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")
from gclm.server.engine.transformers.cpu_linear import pack_linears
from gclm.server.engine.transformers.kv_store import KVStore

CHUNK = 512  # the engine's token budget per pass on a CPU (engine.BATCHED_TOKENS)
HEADS, KV_HEADS, DIM = 9, 3, 64  # SmolLM2-135M


def sdpa_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """A chunk's attention as transformers' SDPA function ran it for the engine."""
    length = q.shape[2]
    width = start + length
    k, v = k[:, :, :width], v[:, :, :width]
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    visible = torch.arange(width)[None, :] <= start + torch.arange(length)[:, None]
    mask = torch.zeros(visible.shape, dtype=q.dtype).masked_fill_(
        ~visible, torch.finfo(q.dtype).min
    )
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], enable_gqa=True)


def new_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    width = start + q.shape[2]
    return causal_attention(q, k[:, :, :width], v[:, :, :width]).transpose(1, 2)


def turns(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, the functions taking turns."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm up (oneDNN builds its kernels per shape once)
    for _ in range(repeats):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def layer(size: int, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    torch.manual_seed(size)
    q = torch.randn(1, HEADS, size, DIM, dtype=dtype) * 4  # peaked weights, as real ones are
    k = torch.randn(1, KV_HEADS, size, DIM, dtype=dtype)
    v = torch.randn(1, KV_HEADS, size, DIM, dtype=dtype)
    starts = range(0, size, CHUNK)

    def run(fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        return torch.cat([fn(q[:, :, s : s + CHUNK], k, v, s) for s in starts], dim=2)

    reference = run(lambda *a: sdpa_chunk(*(t.double() for t in a[:3]), a[3]))
    row: dict[str, Any] = {}
    for name, fn in (("sdpa", sdpa_chunk), ("new", new_chunk)):
        error = (run(fn).double() - reference).abs()
        row[f"{name}_error_mean"] = float(error.mean())
        row[f"{name}_error_max"] = float(error.max())
    seconds = turns({"sdpa": lambda: run(sdpa_chunk), "new": lambda: run(new_chunk)}, repeats)
    row |= {f"{name}_ms": s * 1000 for name, s in seconds.items()}
    row["speedup"] = seconds["sdpa"] / seconds["new"]
    return row


def _switch(model: Any, attention: str) -> None:
    config = getattr(model.config, "text_config", None) or model.config
    config._attn_implementation = attention


def prefill(model: Any, size: int, repeats: int, exact: Any | None) -> dict[str, Any]:
    """`exact`: the float32 model, whose final logits (SDPA) both are measured against."""
    prompt = [1 + (37 * i) % 40000 for i in range(size)]
    logits: dict[str, torch.Tensor] = {}

    def run(on: Any, attention: str, key: str) -> None:
        _switch(on, attention)
        store = KVStore(on, 1)
        store.reserve(size)
        slot = store.claim(prompt)
        for i in range(0, size, CHUNK):
            out = store.extend({slot: prompt[i : i + CHUNK]})
        logits[key] = out[0].float()

    seconds = turns(
        {"sdpa": lambda: run(model, "sdpa", "sdpa"), "new": lambda: run(model, ATTENTION, "new")},
        repeats,
    )
    _switch(model, ATTENTION)
    if exact is not None:
        run(exact, "sdpa", "float32")
    truth = logits["float32" if exact is not None else "sdpa"]
    row = {"sdpa_s": seconds["sdpa"], "new_s": seconds["new"]}
    row["speedup"] = seconds["sdpa"] / seconds["new"]
    row["logits_scale"] = float(truth.abs().max())
    for name in ("sdpa", "new"):
        row[f"{name}_logits_error"] = float((logits[name] - truth).abs().max())
        row[f"{name}_top_token_as_float32"] = bool(logits[name].argmax() == truth.argmax())
    return row


def decode(model: Any, batch: int, repeats: int) -> dict[str, Any]:
    prompts = [
        [1 + (7 * j + b) % 3000 for j in range(150 + 100 * b // max(1, batch - 1))]
        for b in range(batch)
    ]

    def run(attention: str) -> float:
        _switch(model, attention)
        store = KVStore(model, batch)
        slots = [store.claim(p) for p in prompts]
        for slot, prompt in zip(slots, prompts, strict=True):
            store.extend({slot: prompt})
        feed = {slot: [100] for slot in slots}
        store.extend(feed)
        times = []
        for _ in range(8):
            started = time.perf_counter()
            store.extend(feed)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    per_step: dict[str, list[float]] = {"sdpa": [], "new": []}
    for _ in range(repeats):
        per_step["sdpa"].append(run("sdpa"))
        per_step["new"].append(run(ATTENTION))
    _switch(model, ATTENTION)
    a, b = statistics.median(per_step["sdpa"]), statistics.median(per_step["new"])
    return {"sdpa_ms": a * 1000, "new_ms": b * 1000, "speedup": a / b}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-model", action="store_true", help="the layer figures only")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    results: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average": os.getloadavg(),
            "torch": torch.__version__,
            "threads": 1,
        },
        "layer": {},
        "prefill": {},
        "decode": {},
    }
    for name in args.dtypes:
        dtype = getattr(torch, name)
        for size in args.sizes:
            row = results["layer"][f"{name}/{size}"] = layer(size, dtype, args.repeats)
            print(
                f"layer   {name:8s} {size:5d}: SDPA {row['sdpa_ms']:7.1f} ms, new "
                f"{row['new_ms']:7.1f} ms ({row['speedup']:.2f}x); mean error "
                f"{row['sdpa_error_mean']:.1e} / {row['new_error_mean']:.1e}, largest "
                f"{row['sdpa_error_max']:.1e} / {row['new_error_max']:.1e}",
                flush=True,
            )
    if not args.no_model:
        exact = load_model(None, device="cpu", dtype="float32").model
        for name in args.dtypes:
            model = load_model(None, device="cpu", dtype=name).model
            pack_linears(model)  # as the engine does (bfloat16 only)
            for size in args.sizes:
                reference = exact if name != "float32" else None
                row = results["prefill"][f"{name}/{size}"] = prefill(
                    model, size, args.repeats, reference
                )
                print(
                    f"prefill {name:8s} {size:5d}: SDPA {row['sdpa_s']:6.2f} s, new "
                    f"{row['new_s']:6.2f} s ({row['speedup']:.2f}x); final logits off float32's "
                    f"by {row['sdpa_logits_error']:.3f} / {row['new_logits_error']:.3f} (of "
                    f"{row['logits_scale']:.1f}), top token float32's: "
                    f"{row['sdpa_top_token_as_float32']} / {row['new_top_token_as_float32']}",
                    flush=True,
                )
            for batch in args.batches:
                row = results["decode"][f"{name}/{batch}"] = decode(model, batch, args.repeats)
                print(
                    f"decode  {name:8s} batch {batch:3d}: SDPA {row['sdpa_ms']:6.1f} ms, new "
                    f"{row['new_ms']:6.1f} ms a step ({row['speedup']:.2f}x)",
                    flush=True,
                )
            del model
    results["machine"]["load_average_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
