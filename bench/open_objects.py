"""What other keys cost and bring: `declared` against `spec` objects, served, in one run.

    python -m bench.open_objects [--half tune|report|all] [--limit N] [--max-tokens N]
                                 [--concurrency N] [--json PATH]

Takes the MaskBench schemas of ../shared/jsonschemabench (bench/maskbench.py's order and
halves) where the two settings compile differently: some object declares properties and
leaves `additionalProperties` unsaid. Starts `gclm serve` (embedded SmolLM2-135M-Instruct,
CPU, cold cache) and sends each schema twice through the openai SDK, greedy, as a chat
asking for an example object with the schema in the prompt: once with
`structured_outputs.disable_additional_properties: true` (declared properties only, the
default) and once with `false` (the specification's open objects). Per setting:

- refused: the compile's 400 or 429 (`spec` automata are larger);
- valid: outputs a JSON Schema validator accepts (every output should be);
- stop: outputs that ended on their own, not at max_tokens;
- with other keys: outputs holding a key that an object of the schema with declared
  properties neither declares nor requires (found by walking `properties`, `items` and
  local `$ref`s; not `allOf`/`anyOf` branches);
- declared kept: of the top-level declared properties, the share present;
- latency p50: the request, compile included (each schema is new to the server).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import jsonschema
import openai

from bench._server import GclmServer
from bench.maskbench import DEFAULT_SCHEMAS, select

SETTINGS = {"declared": True, "spec": False}  # disable_additional_properties
SCHEMA_CHARS = 1500  # of the schema's JSON in the prompt


def differs(schema: Any) -> bool:
    """Whether some object of `schema` declares properties and leaves additionalProperties
    unsaid (there `spec` allows other keys and `declared` does not)."""
    if isinstance(schema, dict):
        if "properties" in schema and not {"additionalProperties", "unevaluatedProperties"} & set(
            schema
        ):
            return True
        return any(differs(v) for v in schema.values())
    if isinstance(schema, list):
        return any(differs(v) for v in schema)
    return False


def other_keys(value: Any, schema: Any, root: Any, depth: int = 0) -> int:
    """Keys of `value` that its schema's objects with declared properties neither declare
    nor require, where they leave additionalProperties and patternProperties unsaid."""
    if depth > 20 or not isinstance(schema, dict):
        return 0
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = (
                target.get(part.replace("~1", "/").replace("~0", "~"), {})
                if isinstance(target, dict)
                else {}
            )
        return other_keys(value, target, root, depth + 1)
    props = schema.get("properties")
    if isinstance(value, dict) and isinstance(props, dict) and props:
        named = set(props) | set(schema.get("required", []))
        said = {"additionalProperties", "patternProperties"} & set(schema)
        n = 0 if said else sum(k not in named for k in value)
        return n + sum(
            other_keys(v, props[k], root, depth + 1) for k, v in value.items() if k in props
        )
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return sum(other_keys(v, schema["items"], root, depth + 1) for v in value)
    return 0


def ask(client: openai.OpenAI, schema: Any, disable: bool, max_tokens: int) -> dict[str, Any]:
    text = json.dumps(schema, ensure_ascii=False)[:SCHEMA_CHARS]
    started = time.perf_counter()
    try:
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[
                {
                    "role": "user",
                    "content": f"Write an example JSON object for this schema:\n{text}",
                }
            ],
            max_tokens=max_tokens,
            temperature=0,
            extra_body={
                "structured_outputs": {"json": schema, "disable_additional_properties": disable}
            },
        )
    except openai.APIStatusError as e:
        return {"refused": e.status_code, "seconds": time.perf_counter() - started}
    choice = reply.choices[0]
    return {
        "text": choice.message.content,
        "finish_reason": choice.finish_reason,
        "seconds": time.perf_counter() - started,
    }


def judge(schema: Any, row: dict[str, Any]) -> dict[str, Any]:
    if "text" not in row:
        return row
    value = json.loads(row["text"])
    try:
        valid: bool | None = jsonschema.validators.validator_for(schema)(schema).is_valid(value)
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError):
        valid = None  # the validator cannot read the schema: not counted
    props = schema.get("properties") if isinstance(schema, dict) else None
    kept = None
    if isinstance(props, dict) and props and isinstance(value, dict):
        kept = sum(k in value for k in props) / len(props)
    return {
        **row,
        "valid": valid,
        "other_keys": other_keys(value, schema, schema),
        "declared_kept": kept,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answered = [r for r in rows if "text" in r]
    kept = [r["declared_kept"] for r in answered if r["declared_kept"] is not None]
    return {
        "schemas": len(rows),
        "refused": len(rows) - len(answered),
        "valid": sum(r["valid"] is True for r in answered),
        "invalid": sum(r["valid"] is False for r in answered),
        "stop": sum(r["finish_reason"] == "stop" for r in answered),
        "with_other_keys": sum(r["other_keys"] > 0 for r in answered),
        "other_keys": sum(r["other_keys"] for r in answered),
        "declared_kept": round(statistics.mean(kept), 3) if kept else None,
        "latency_p50_s": round(statistics.median(r["seconds"] for r in rows), 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--half", choices=("tune", "report", "all"), default="report")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--rejudge", type=Path, help="judge the replies of an earlier --json again, serving nothing"
    )
    args = parser.parse_args(argv)
    if args.rejudge:
        return rejudge(args.rejudge, args.json)
    paths = [
        p for p in select(DEFAULT_SCHEMAS, args.half, None, None)
        if differs(json.loads(p.read_text())["schema"])
    ][: args.limit]  # fmt: skip
    schemas = [json.loads(p.read_text())["schema"] for p in paths]
    print(f"{len(paths)} schemas ({args.half} half) where the two settings differ", flush=True)
    rows: dict[str, list[dict[str, Any]]] = {}
    with GclmServer(max_batch=8) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", timeout=600)
        with ThreadPoolExecutor(args.concurrency) as pool:
            for name, disable in SETTINGS.items():
                request = partial(ask, client, disable=disable, max_tokens=args.max_tokens)
                replies = pool.map(request, schemas)
                rows[name] = [
                    {"schema": p.name, **judge(s, r)}
                    for p, s, r in zip(paths, schemas, replies, strict=True)
                ]
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": {name: summarize(r) for name, r in rows.items()},
        "rows": rows,
    }
    for name, summary in result["summary"].items():
        print(name, json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result


def rejudge(source: Path, out: Path | None) -> dict[str, Any]:
    """An earlier run's replies judged again (after a change to `judge`)."""
    result = json.loads(source.read_text())
    for name, rows in result["rows"].items():
        for i, row in enumerate(rows):
            schema = json.loads((DEFAULT_SCHEMAS / row["schema"]).read_text())["schema"]
            reply = {k: row[k] for k in ("text", "finish_reason", "seconds", "refused") if k in row}
            rows[i] = {"schema": row["schema"], **judge(schema, reply)}
        result["summary"][name] = summarize(rows)
        print(name, json.dumps(result["summary"][name]))
    if out:
        out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result


if __name__ == "__main__":
    main()
