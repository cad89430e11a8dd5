"""numba's on-disk cache for gclm's compiled functions, one folder per numba version.

numba keeps one index file per function in the source's `__pycache__`, and an index written
by another numba version is discarded and overwritten. gclm's environment and vLLM's pin
different numba versions over the same source tree, so each process found the other's index
and compiled cold: the compile workers' fork server took 18-37 s to start on a loaded 2-core
machine instead of about 1 s, and the vLLM plugin's first requests waited for it. Files
registered here cache under `__pycache__/numba-<version>/`, so both versions stay warm.
"""

from __future__ import annotations

import os

import numba
from numba.core import caching

_FILES: set[str] = set()


class _VersionedLocator(caching.InTreeCacheLocator):
    """The in-tree cache, in a folder of this numba version, for registered files only."""

    def get_cache_path(self) -> str:
        return os.path.join(super().get_cache_path(), f"numba-{numba.__version__}")

    @classmethod
    def from_function(cls, py_func, py_file):
        if os.path.abspath(py_file) not in _FILES:
            return None
        return super().from_function(py_func, py_file)


def cache_per_version(module_file: str) -> None:
    """Cache the numba functions of `module_file` per numba version (call before defining
    them). A cache folder the user chose (NUMBA_CACHE_DIR) is left as it is."""
    if numba.config.CACHE_DIR:
        return
    _FILES.add(os.path.abspath(module_file))
    locators = caching.CacheImpl._locator_classes
    if _VersionedLocator not in locators:
        locators.insert(0, _VersionedLocator)
