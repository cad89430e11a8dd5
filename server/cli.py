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
from gclm.server.settings import add_arguments

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
    add_arguments(serve)  # one flag per setting, help from server/settings.py
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
    from gclm.compiler import DEFAULT_WHITESPACE, parse_constraint

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
    from gclm.compiler import CompileLimits, CompilerPool, TokenVocabulary, cache_key
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
