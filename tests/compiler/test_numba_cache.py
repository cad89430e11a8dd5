"""The token walk's numba cache lives in a folder of its numba version, so gclm's and
vLLM's environments (different numba pins, one source tree) do not discard each other's."""

from __future__ import annotations

from pathlib import Path

import numba

from gclm.compiler.whole import token_walk


def test_token_walk_functions_cache_per_numba_version() -> None:
    path = Path(token_walk._walk._cache._cache_path)
    assert path.name == f"numba-{numba.__version__}"
    assert path.parent == Path(token_walk.__file__).parent / "__pycache__"


def test_other_modules_keep_numba_s_own_locator(tmp_path: Path, monkeypatch) -> None:
    module = tmp_path / "elsewhere.py"
    module.write_text("import numba\n\n@numba.njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import elsewhere

    assert elsewhere.twice(3) == 6
    assert Path(elsewhere.twice._cache._cache_path) == tmp_path / "__pycache__"
