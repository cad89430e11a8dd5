"""mkdocs hook: links from a page to a repository file outside docs/ (`../bench/results/x.md`).

Such links read right on a code host, where the page sits in docs/. mkdocs only knows the
files under docs/, and strict mode fails on any other link; so every target a page links to
outside docs/ that exists in the repository is copied into the site, as it is (not rendered),
under `repo/`, and mkdocs rewrites the link to that copy. A target that does not exist is left
alone, and mkdocs fails on it as on any broken link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel

LINK = re.compile(r"\]\((\.\./[^)\s#]+)")


class RepositoryFile(File):
    """A repository file outside docs/, copied as it is: never rendered as a page."""

    def is_documentation_page(self) -> bool:
        return False

    def is_static_page(self) -> bool:
        return False


def on_files(files: Files, config: MkDocsConfig) -> Files:
    docs = Path(config.docs_dir).resolve()
    repository = docs.parent
    for page in list(files.documentation_pages()):
        text = Path(page.abs_src_path or "").read_text(encoding="utf-8")
        for link in LINK.findall(text):
            src_uri = posixpath.normpath(posixpath.join(posixpath.dirname(page.src_uri), link))
            target = (docs / src_uri).resolve()
            if files.get_file_from_path(src_uri) or not target.is_file():
                continue
            if repository not in target.parents:
                continue
            inside = target.relative_to(repository).as_posix()
            files.append(
                RepositoryFile(
                    src_uri,
                    src_dir=str(docs),
                    dest_dir=config.site_dir,
                    use_directory_urls=config.use_directory_urls,
                    dest_uri=f"repo/{inside}",
                    inclusion=InclusionLevel.NOT_IN_NAV,
                )
            )
    return files
