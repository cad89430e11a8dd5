"""gclm's engine step beside vLLM-CPU's `LLMEngine.step`, engine only, no HTTP.

    python -m bench.engine_step [--batches 1 8 32 64] [--layers 2] [--deep-layers 30]
                                [--steps 32] [--repeats 3] [--dtype float32] [--threads 1]
                                [--vllm-eager] [--no-vllm] [--json PATH]

The same tiny random Llama on both sides: the embedded SmolLM2's config and 49k tokenizer
with `--layers` layers of width 64 (2 heads of 32 on 1 key/value head, MLP 128), random
weights (seed 0), written once under gclm's cache directory. gclm's BatchEngine runs in this
process as `gclm serve` builds it (its default dtype and threads, unless given); vLLM-CPU runs
in its own environment (`make install-vllm`) and process, as `vllm.LLMEngine` in process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), compiled as vLLM's default unless `--vllm-eager`, with
gclm's number of threads, unpinned unless `--vllm-bind` names cores. The two take turns:
for each repeat, batch size and arm, gclm then vLLM.

A turn submits `batch` greedy requests (distinct 16-token prompts) of `--steps` tokens each,
waits until every one has its first token, and times the steps from there to the last one:
every step timed is a decode step of `batch` rows. Two arms at equal output lengths:
unconstrained (vLLM with `ignore_eos`), and constrained by the regex `[a-z ]+` (gclm's own
mask, budget-aware; vLLM's structured outputs, xgrammar), which a random model's greedy
output follows to the budget. gclm's figure is the engine thread's seconds per step (its
`step_seconds` counter over its `steps`), beside the wall time per step; vLLM's is the wall
time of its `step()` calls. Medians over the repeats; ratios gclm / vLLM (below 1: gclm is
faster) and constrained / unconstrained per side.

`--deep-layers N` adds batch 1 on the same model with N layers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REGEX = "[a-z ]+"
PROMPT_TOKENS = 16
RESULT = "@@engine_step "  # the vLLM worker's result lines start with this


# --- the model both sides load ---


def model_dir(layers: int) -> Path:
    """The tiny model's directory (config, random weights, the embedded tokenizer), built on
    first call."""
    from gclm.paths import default_cache_dir

    directory = default_cache_dir() / "models" / f"engine-step-llama-L{layers}-h64"
    if (directory / "model.safetensors").exists():
        return directory
    import torch
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    from gclm.server.engine.model_loader import embedded_model_dir, load_tokenizer

    source = embedded_model_dir()
    tokenizer = load_tokenizer(str(source))
    base = AutoConfig.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=base.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,  # heads of 32: the smallest vLLM-CPU's attention takes
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=base.eos_token_id,
        bos_token_id=base.bos_token_id,
        pad_token_id=base.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


def prompts(batch: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]


# --- gclm ---


class Gclm:
    """A BatchEngine on the model, as `gclm serve` builds it."""

    def __init__(self, directory: Path, dtype: str, max_batch: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from gclm.compiler.front.constraint import Constraint
        from gclm.compiler.service.cache import TableCache
        from gclm.compiler.vocab.vocabulary import TokenVocabulary
        from gclm.compiler.whole.compile import compile_constraint
        from gclm.server.engine.model_loader import load_tokenizer, resolve_dtype
        from gclm.server.engine.transformers.engine import BatchEngine

        torch_dtype = resolve_dtype(dtype, torch.device("cpu"))
        self.dtype = str(torch_dtype)
        tokenizer = load_tokenizer(str(directory))
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch_dtype).eval()
        vocab = TokenVocabulary.from_tokenizer(tokenizer)
        cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
        self.engine = BatchEngine(
            model,
            tokenizer,
            model_id="bench",
            vocab=vocab,
            cache=cache,
            max_batch=max_batch,
            kv_memory=256 << 20,
            queue_size=1024,
        )
        self.table = compile_constraint(Constraint.regex(REGEX), vocab)
        self.threads = torch.get_num_threads()

    def turn(self, batch: int, steps: int, constrained: bool, seed: int) -> dict[str, Any]:
        return asyncio.run(self._turn(batch, steps, constrained, seed))

    async def _turn(self, batch: int, steps: int, constrained: bool, seed: int) -> dict[str, Any]:
        from gclm.server.engine.protocol import (
            ErrorEvent,
            FinishEvent,
            GenerationRequest,
            PreparedConstraint,
            SamplingParams,
            TokenEvent,
        )

        engine = self.engine
        started: list[bool] = []
        all_started = asyncio.Event()
        lengths: list[int] = []
        texts: list[str] = []
        marks: dict[str, Any] = {}

        async def one(prompt: list[int]) -> None:
            request = GenerationRequest(
                prompt,
                SamplingParams(max_tokens=steps, temperature=0.0),
                constraint=PreparedConstraint.of(self.table) if constrained else None,
            )
            handle = engine.submit(request)
            first = True
            text = []
            async for event in engine.stream(handle):
                if isinstance(event, TokenEvent):
                    text.append(event.text)
                    if first:
                        first = False
                        started.append(True)
                        if len(started) == batch:
                            marks["start"] = (engine.stats().gauges, time.perf_counter())
                            all_started.set()
                elif isinstance(event, FinishEvent):
                    lengths.append(event.completion_tokens)
                elif isinstance(event, ErrorEvent):
                    raise event.error
            texts.append("".join(text))

        await asyncio.gather(*(one(p) for p in prompts(batch, seed)))
        end = time.perf_counter()
        gauges = engine.stats().gauges
        before, wall0 = marks["start"]
        count = gauges["steps"] - before["steps"]
        seconds = gauges["step_seconds"] - before["step_seconds"]
        return {
            "step_ms": 1e3 * seconds / max(1, count),
            "wall_step_ms": 1e3 * (end - wall0) / max(1, count),
            "steps": count,
            "mean_tokens": statistics.mean(lengths),
            "valid": all(_matches(t) for t in texts) if constrained else None,
        }

    def close(self) -> None:
        self.engine.shutdown()


def _matches(text: str) -> bool:
    import re

    return re.fullmatch(REGEX, text) is not None


# --- vLLM (run in its own environment: `python -m bench.engine_step --vllm-worker`) ---


def vllm_worker(directory: Path, dtype: str, max_batch: int, eager: bool) -> None:
    """Serve turns read from stdin as JSON lines; answer each on stdout after RESULT."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import EngineArgs, LLMEngine, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(directory),
            dtype=dtype,
            max_num_seqs=max_batch,
            max_model_len=2048,
            enforce_eager=eager,
            seed=0,
            disable_log_stats=True,
        )
    )
    ids = 0

    def turn(batch: int, steps: int, constrained: bool, seed: int) -> dict[str, Any]:
        nonlocal ids
        params = SamplingParams(
            temperature=0.0,
            max_tokens=steps,
            ignore_eos=True,
            structured_outputs=StructuredOutputsParams(regex=REGEX) if constrained else None,
        )
        names = []
        for prompt in prompts(batch, seed):
            ids += 1
            names.append(str(ids))
            engine.add_request(names[-1], {"prompt_token_ids": prompt}, params)
        counts = dict.fromkeys(names, 0)
        texts = dict.fromkeys(names, "")
        timed, seconds = 0, 0.0
        while engine.has_unfinished_requests():
            decoding = all(counts.values())
            t = time.perf_counter()
            outputs = engine.step()
            spent = time.perf_counter() - t
            if decoding:
                timed += 1
                seconds += spent
            for out in outputs:
                counts[out.request_id] = len(out.outputs[0].token_ids)
                texts[out.request_id] = out.outputs[0].text
        return {
            "step_ms": 1e3 * seconds / max(1, timed),
            "steps": timed,
            "mean_tokens": statistics.mean(counts.values()),
            "valid": all(_matches(t) for t in texts.values()) if constrained else None,
        }

    turn(1, 4, False, 0)  # warm up
    print(RESULT + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        print(RESULT + json.dumps(turn(**ask)), flush=True)


class Vllm:
    """The vLLM worker process, one turn at a time."""

    def __init__(
        self, directory: Path, dtype: str, max_batch: int, eager: bool, threads: int, bind: str
    ) -> None:
        from bench._vllm import vllm_env, vllm_python

        command = [
            str(vllm_python()), "-m", "bench.engine_step", "--vllm-worker",
            "--model-dir", str(directory), "--dtype", dtype, "--max-batch", str(max_batch),
        ] + (["--vllm-eager"] if eager else [])  # fmt: skip
        env = vllm_env(bind) | {"OMP_NUM_THREADS": str(threads)}
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[1],
        )
        self._read()

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])
            sys.stderr.write(line)  # vLLM's log
        raise RuntimeError(f"the vLLM worker ended (exit {self.process.wait()})")

    def turn(self, batch: int, steps: int, constrained: bool, seed: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        ask = {"batch": batch, "steps": steps, "constrained": constrained, "seed": seed}
        self.process.stdin.write(json.dumps(ask) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


# --- the run ---


def run_model(
    args: argparse.Namespace, layers: int, batches: list[int], report: dict[str, Any]
) -> dict[str, Any]:
    directory = model_dir(layers)
    gclm = Gclm(directory, args.dtype, max(batches))
    report.setdefault("gclm_dtype", gclm.dtype)
    report.setdefault("gclm_threads", gclm.threads)
    vllm_dtype = gclm.dtype.removeprefix("torch.")
    vllm = None
    if not args.no_vllm:
        bind = args.vllm_bind
        vllm = Vllm(directory, vllm_dtype, max(batches), args.vllm_eager, gclm.threads, bind)
    arms = ("unconstrained", "constrained")
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for b in batches:  # warm up each batch size on both sides
            for runner in (gclm,) if vllm is None else (gclm, vllm):
                runner.turn(b, 4, False, 0)
                runner.turn(b, 4, True, 0)
        for repeat in range(args.repeats):
            for b in batches:
                for arm in arms:
                    sides = {"gclm": gclm} | ({} if vllm is None else {"vllm": vllm})
                    for side, runner in sides.items():
                        got = runner.turn(b, args.steps, arm == "constrained", repeat + 1)
                        raw.setdefault(f"{b}/{arm}", {}).setdefault(side, []).append(got)
                        print(f"L{layers} b{b} {arm} {side} r{repeat}: {got}", flush=True)
    finally:
        gclm.close()
        if vllm is not None:
            vllm.close()
    rows: dict[str, Any] = {}
    for key, sides in raw.items():
        row: dict[str, Any] = {"repeats": sides}
        for side, turns in sides.items():
            row[f"{side}_step_ms"] = statistics.median(t["step_ms"] for t in turns)
            row[f"{side}_mean_tokens"] = statistics.mean(t["mean_tokens"] for t in turns)
            valid = [t["valid"] for t in turns if t["valid"] is not None]
            if valid:
                row[f"{side}_valid"] = all(valid)
        if "vllm" in sides:
            row["ratio"] = row["gclm_step_ms"] / row["vllm_step_ms"]
        rows[key] = row
    for b in batches:
        for side in ("gclm", "vllm"):
            c, u = rows[f"{b}/constrained"], rows[f"{b}/unconstrained"]
            if f"{side}_step_ms" in c:
                c[f"{side}_constrained_over_unconstrained"] = (
                    c[f"{side}_step_ms"] / u[f"{side}_step_ms"]
                )
    return rows


def print_table(layers: int, rows: dict[str, Any]) -> None:
    print(f"\n{layers} layers: ms per decode step (median), gclm / vLLM, c/u per side")
    for key, row in rows.items():
        line = f"  b{key:<18} gclm {row['gclm_step_ms']:7.2f}"
        if "vllm_step_ms" in row:
            line += f"  vLLM {row['vllm_step_ms']:7.2f}  ratio {row['ratio']:.2f}x"
        for side in ("gclm", "vllm"):
            if f"{side}_constrained_over_unconstrained" in row:
                line += f"  {side} c/u {row[f'{side}_constrained_over_unconstrained']:.2f}"
        print(line)


def load_average() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--deep-layers", type=int, default=30, help="0: no deep model")
    ap.add_argument("--steps", type=int, default=32, help="tokens per request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="auto", help="gclm's --dtype; vLLM gets the same")
    ap.add_argument("--threads", type=int, default=None, help="gclm's torch threads")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM --enforce-eager")
    ap.add_argument(
        "--vllm-bind",
        default="nobind",
        help="VLLM_CPU_OMP_THREADS_BIND (a core list, or nobind: on a shared machine a thread "
        "pinned to one busy core waits where gclm's unpinned one moves)",
    )
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.vllm_worker:
        vllm_worker(args.model_dir, args.dtype, args.max_batch, args.vllm_eager)
        return
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        import torch

        torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average_start": load_average(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "steps": args.steps,
        "repeats": args.repeats,
        "vllm_eager": args.vllm_eager,
        "vllm_bind": args.vllm_bind,
        "regex": REGEX,
    }
    models = [(args.layers, args.batches)]
    if args.deep_layers:
        models.append((args.deep_layers, [1]))
    for layers, batches in models:
        rows = run_model(args, layers, batches, report)
        report[f"layers_{layers}"] = rows
        print_table(layers, rows)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    report["load_average_end"] = load_average()
    print(f"load average: start {report['load_average_start']}, end {report['load_average_end']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
