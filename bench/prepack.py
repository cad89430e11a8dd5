"""Decode steps with bfloat16 weights prepacked for oneDNN vs plain, same model, one run.

    python -m bench.prepack [--json PATH] [--steps N] [--repeats N]

Two copies of the embedded SmolLM2-135M-Instruct in bfloat16 on the CPU, one through
`server.cpu_linear.pack_linears` (what the engine does there). For batch 1, 8 and 32 (prompts
of 150 tokens) each copy runs `--steps` decode steps through a KVStore, the two taking turns
`--repeats` times; prints the median ms per step of each, their ratio, and whether the two
gave the same logits to the bit.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gclm.server.engine.model_loader import load_model
from gclm.server.engine.transformers.cpu_linear import pack_linears
from gclm.server.engine.transformers.kv_store import KVStore

BATCHES = (1, 8, 32)


def steps_ms(model: Any, batch: int, steps: int) -> tuple[float, torch.Tensor]:
    """Median ms per decode step over `steps` steps after a prefill, and the last logits."""
    store = KVStore(model, batch)
    prompts = [[1 + (7 * j + b) % 3000 for j in range(150)] for b in range(batch)]
    slots = [store.claim(p) for p in prompts]
    store.extend(dict(zip(slots, prompts, strict=True)))
    feed = {slot: [100] for slot in slots}
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        logits = store.extend(feed)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, logits


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    plain = load_model(None, device="cpu", dtype="bfloat16").model
    packed = copy.deepcopy(plain)
    layers = pack_linears(packed)
    print(f"{layers} linear layers prepacked; 1 thread", flush=True)
    results: dict[str, Any] = {}
    for batch in BATCHES:
        runs: dict[str, list[float]] = {"plain": [], "prepacked": []}
        logits = {}
        for _ in range(args.repeats):
            for name, model in (("plain", plain), ("prepacked", packed)):
                ms, logits[name] = steps_ms(model, batch, args.steps)
                runs[name].append(ms)
        med = {name: statistics.median(v) for name, v in runs.items()}
        results[str(batch)] = {
            "ms_per_step": med,
            "ms_each_repeat": runs,
            "speedup": med["plain"] / med["prepacked"],
            "same_logits": bool(torch.equal(logits["plain"], logits["prepacked"])),
        }
        r = results[str(batch)]
        print(
            f"batch {batch:2d}: plain {med['plain']:6.1f} ms, prepacked {med['prepacked']:6.1f} "
            f"ms per step, speedup {r['speedup']:.2f}x, same logits {r['same_logits']}",
            flush=True,
        )
    given = argv if argv is not None else sys.argv[1:]
    out = {
        "command": "python -m bench.prepack " + " ".join(given),
        "loadavg_after": os.getloadavg(),
        "batches": results,
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
