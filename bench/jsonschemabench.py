"""The jsonschemabench corpus the compile and budget benchmarks read: where it is, and
which subset each file belongs to."""

from __future__ import annotations

import re
from pathlib import Path

# ../shared/jsonschemabench beside the repository.
DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "jsonschemabench"


def subset_of(filename: str) -> str:
    """A file's subset: its name's prefix before `---` or before the first `_<digit>`
    (Github_easy, BFCL_parallel_multiple, ...). No subset's own name has a `_<digit>`, so
    `JsonSchemaStore_2019_5.json` is in JsonSchemaStore."""
    return re.split(r"---|_(?=\d)", Path(filename).stem, maxsplit=1)[0]
