"""The `gclm` command: `gclm serve` and `gclm compile`.

Errors print one line to stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from gclm.errors import GclmError

log = logging.getLogger("gclm")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return args.run(args)
    except (GclmError, ValueError, OSError) as e:
        message = e.message if isinstance(e, GclmError) else str(e)
        print(f"gclm: error: {' '.join(message.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gclm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the OpenAI-compatible server")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--model", help="hub id or local directory (default: embedded SmolLM2-135M)")
    serve.add_argument("--device", help="auto | cpu | cuda | cuda:N | mps (default auto)")
    serve.add_argument("--dtype", help="auto | float32 | float16 | bfloat16 (default auto)")
    serve.add_argument(
        "--max-batch", type=int, help="sequences decoded together (default: what --kv-memory holds)"
    )
    serve.add_argument(
        "--kv-memory", type=int, help="MiB for the KV cache (default: a share of free memory)"
    )
    serve.add_argument(
        "--fast-forward",
        choices=("on", "off"),
        help="check the text a constraint forces in one forward pass (default on)",
    )
    serve.add_argument(
        "--queue-size", type=int, help="sequences waiting beyond the free KV slots before 429 (64)"
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="positions one step computes; longer prompts prefill in chunks (0: 512 CPU, 2048 GPU)",
    )
    serve.add_argument(
        "--max-step-seconds",
        type=float,
        help="while streams decode, prefill chunks that keep a step near this (1.0; 0: off)",
    )
    serve.add_argument(
        "--prefill-thread",
        choices=("auto", "on", "off"),
        help="prefill long prompts on a thread of their own beside the decoding streams "
        "(auto: on a CPU with a core to spare)",
    )
    serve.add_argument("--cache-dir", type=Path, help="model and compiled-table cache")
    serve.add_argument(
        "--compile-timeout", type=float, help="seconds a compile may take, queue included (10)"
    )
    serve.add_argument(
        "--compile-workers", type=int, help="compile processes (default: one per core, 2-8)"
    )
    serve.add_argument("--compile-queue", type=int, help="compiles waiting before 429 (64)")
    serve.add_argument("--compile-memory", type=int, help="MiB per compile process (4096)")
    serve.add_argument(
        "--compile-cpu-limit",
        type=float,
        help="CPU seconds a compile may use, in the background too; past it a 400 from then on "
        "(60)",
    )
    serve.add_argument("--cache-memory", type=int, help="MiB of compiled tables in memory (512)")
    serve.add_argument("--cache-disk", type=int, help="MiB of compiled tables on disk (2048)")
    serve.add_argument("--max-body-size", type=int, help="MiB per request body (16)")
    serve.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' on every route but /health"
    )
    serve.add_argument(
        "--api-keys-file",
        type=Path,
        help="several keys, one a line: KEY [name=N] [rpm=N] [concurrent=N] "
        "[tokens_per_minute=N] [compile_seconds_per_minute=S]",
    )
    serve.add_argument(
        "--public-metrics", choices=("on", "off"), help="on: /metrics needs no key (default off)"
    )
    serve.add_argument(
        "--header-timeout", type=float, help="seconds for a request's headers to arrive (10)"
    )
    serve.add_argument("--body-timeout", type=float, help="seconds for a request's body (60)")
    serve.add_argument(
        "--keep-alive-timeout", type=float, help="seconds an idle connection stays open (5)"
    )
    serve.add_argument(
        "--max-connections", type=int, help="open connections before 503 (default 1024)"
    )
    serve.add_argument(
        "--cors-origins", help="origins browsers may call from, comma-separated (default: none)"
    )
    serve.add_argument(
        "--allowed-hosts", help="Host names answered, comma-separated (default: any)"
    )
    serve.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        help="generation engine (default transformers)",
    )
    serve.add_argument(
        "--reasoning-parser",
        choices=("deepseek_r1", "qwen3"),
        help="the model thinks between <think> and </think> before it answers (default: off)",
    )
    serve.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="Jinja chat template to use instead of the model's",
    )
    vllm = serve.add_argument_group("vLLM engine options (with --engine vllm)")
    vllm.add_argument("--tensor-parallel-size", type=int, help="GPUs per model replica (default 1)")
    vllm.add_argument("--pipeline-parallel-size", type=int, help="pipeline stages (default 1)")
    vllm.add_argument(
        "--distributed-executor-backend",
        choices=("mp", "ray", "uni", "external_launcher"),
        help="how vLLM runs its workers; ray spans several nodes",
    )
    vllm.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    vllm.add_argument("--gpu-memory-utilization", type=float, help="share of GPU memory (0.9)")
    vllm.add_argument("--prefix-caching", choices=("auto", "on", "off"), help="default auto")
    vllm.add_argument(
        "--enforce-eager", choices=("auto", "on", "off"), help="on: no compile/CUDA graphs"
    )
    serve.set_defaults(run=_serve)

    comp = sub.add_parser("compile", help="compile a constraint and print its table's figures")
    what = comp.add_mutually_exclusive_group(required=True)
    what.add_argument("--json-schema", type=Path, metavar="FILE", help="a JSON Schema file")
    what.add_argument("--regex", metavar="RX", help="a regular expression")
    what.add_argument("--choice", action="append", metavar="TEXT", help="one choice (repeat)")
    comp.add_argument("--tokenizer", help="hub id or directory (default: the embedded model's)")
    comp.add_argument("--whitespace", help="regex for whitespace between JSON tokens")
    comp.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    comp.add_argument("--json", action="store_true", help="print one JSON object")
    comp.set_defaults(run=_compile)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from gclm.server.launch import serve
    from gclm.server.settings import ServerSettings

    overrides = {k: v for k, v in vars(args).items() if k != "run"}
    serve(ServerSettings.from_env(**overrides))
    return 0


def _constraint(args: argparse.Namespace) -> Any:
    from gclm.compiler.constraint import DEFAULT_WHITESPACE, parse_constraint

    if args.json_schema is not None:
        try:
            spec = {"json": args.json_schema.read_text()}
        except OSError as e:
            raise ValueError(f"cannot read {args.json_schema}: {e.strerror}") from None
    elif args.regex is not None:
        spec = {"regex": args.regex}
    else:
        spec = {"choice": args.choice}
    return parse_constraint(spec, whitespace=args.whitespace or DEFAULT_WHITESPACE)


def _compile(args: argparse.Namespace) -> int:
    from gclm.compiler.cache import cache_key
    from gclm.compiler.pool import CompilerPool
    from gclm.compiler.vocabulary import TokenVocabulary
    from gclm.compiler.worker import CompileLimits
    from gclm.server.engine.model_loader import load_tokenizer

    logging.getLogger().setLevel(logging.WARNING)
    constraint = _constraint(args)
    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(args.tokenizer))
    pool = CompilerPool(vocab, CompileLimits(timeout_s=args.timeout), workers=1)
    try:
        pool.wait_ready()
        started = time.perf_counter()
        table = pool.compile(constraint)
        wall = time.perf_counter() - started
    finally:
        pool.close()
    dense = table.num_states * vocab.size * 8
    report: dict[str, Any] = {
        "states": table.num_states,
        "transitions": table.num_transitions,
        "min_tokens": table.min_tokens,
        "shortest_output": table.shortest_output,
        "compile_seconds": round(table.compile_seconds, 4),
        "table_bytes": table.nbytes,
        "dense_table_bytes": dense,
        "cache_key": cache_key(constraint, vocab.fingerprint),
        "groups": table.num_groups,
        "unique_token_sets": len(table.token_sets),
        "rewrites": list(table.rewrites),
        "wall_seconds": round(wall, 4),
    }
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
        return 0
    print(f"states          {report['states']:,} ({report['transitions']:,} transitions)")
    print(f"min_tokens      {report['min_tokens']}")
    print(f"shortest output {report['shortest_output']!r}")
    print(f"compiled in     {report['compile_seconds']:.3f} s")
    print(
        f"table           {report['table_bytes']:,} bytes "
        f"({100 * report['table_bytes'] / max(dense, 1):.3f}% of a dense S x V int64 table)"
    )
    print(f"cache key       {report['cache_key']}")
    for line in report["rewrites"]:
        print(f"rewrite         {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
