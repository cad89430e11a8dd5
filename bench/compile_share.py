"""A slow compile's share of the CPU beside busy processes, by its niceness (issue 22 (d)).

    python -m bench.compile_share [--hogs 6] [--nices 0 5] [--fields 6] [--json PATH]

One compile process per niceness in `--nices`, each compiling its own copy of the same
schema (`--fields` free-text fields of 400 characters: ~5 s of CPU on a quiet core, almost
all of it in the token walk), all started together beside `--hogs` busy processes at
nice 0: each compile's wall time, CPU time and share of a core, side by side in one run.
The baseline is the first niceness (0: what one of the engine's threads gets); the figure
to read is each one's wall time over it. A compile worker the pool has demoted runs at
compiler/service/pool.py's DEMOTED_NICE.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def schema(fields: int, tag: str) -> dict[str, Any]:
    props = {f"f{j}_{tag}": {"type": "string", "maxLength": 400} for j in range(fields)}
    return {"type": "object", "properties": props}


def _compile(nice: int, fields: int, barrier: Any, out: Any) -> None:
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.vocab.vocabulary import TokenVocabulary
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.server.engine.model_loader import load_tokenizer

    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(None))
    compile_constraint(Constraint.choice(["warm"]), vocab)  # numba's cache loaded
    constraint = Constraint.json_schema(schema(fields, f"n{nice}"))
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    barrier.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    compile_constraint(constraint, vocab)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out.put({"nice": nice, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})


def run(hogs: int, nices: list[int], fields: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(nices) + 1), ctx.Queue()
    procs = [ctx.Process(target=_compile, args=(n, fields, barrier, out)) for n in nices]
    for proc in procs:
        proc.start()
    barrier.wait()  # all warm: start the load and the compiles together
    spin = "while True: pass\n"
    load = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(hogs)]
    try:
        results = [out.get(timeout=3600) for _ in procs]
        results.sort(key=lambda r: nices.index(r["nice"]))
    finally:
        for hog in load:
            hog.kill()
            hog.wait()
        for proc in procs:
            proc.join(30)
    base = results[0]["wall_s"]
    for r in results:
        r["core_share"] = round(r["cpu_s"] / r["wall_s"], 3)
        r["wall_over_first"] = round(r["wall_s"] / base, 2)
    return {"cores": os.cpu_count(), "hogs": hogs, "fields": fields, "compiles": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hogs", type=int, default=6)
    parser.add_argument("--nices", type=int, nargs="+", default=[0, 5])
    parser.add_argument("--fields", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args.hogs, args.nices, args.fields)
    for r in result["compiles"]:
        print(
            f"nice {r['nice']:>2}: {r['wall_s']:7.2f} s wall, {r['cpu_s']:6.2f} s CPU, "
            f"{r['core_share']:.3f} of a core, {r['wall_over_first']}x the first"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
