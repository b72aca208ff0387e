"""MkDocs hook: serve the repository files that the docs pages link to.

The pages under ``docs/`` link to files elsewhere in the repository the way GitHub resolves them
(``../figures/gemma-3-270m/patching_curves.png``, ``../benchmarks/results/site_fv.md``,
``../notebooks/01_head_importance.ipynb``), so the same Markdown reads right on GitHub and in the
site. MkDocs only knows files under ``docs_dir``; this hook follows every relative link of every
page that leaves ``docs/``, and adds the target as a file whose source URI is the very link
(``../figures/...``), so MkDocs's own link check resolves it, and whose destination is
``repo/<path>`` inside the site. Linked Markdown files (benchmark results, READMEs) become pages
themselves, and their links are followed in turn. Nothing is copied into ``docs/`` and no symlink
is needed. A link to a missing file is left alone, so ``mkdocs build --strict`` still reports it.
"""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File, Files, InclusionLevel

_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)|(?:src|href)=\"([^\"]+)\"")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
PREFIX = "repo"


def _targets(text: str):
    for m in _LINK.finditer(text):
        link = m.group(1) or m.group(2)
        if not link or link.startswith(("#", "/")) or _SCHEME.match(link):
            continue
        link = link.split("#", 1)[0].split("?", 1)[0]
        if link:
            yield link


def on_files(files: Files, config) -> Files:
    docs_dir = os.path.realpath(config["docs_dir"])
    root = os.path.dirname(docs_dir)
    site_dir, urls = config["site_dir"], config["use_directory_urls"]
    queue = [f.abs_src_path for f in files.documentation_pages() if f.abs_src_path]
    seen = set(queue)
    while queue:
        page = queue.pop()
        with open(page, encoding="utf-8") as fh:
            text = fh.read()
        for link in _targets(text):
            target = os.path.normpath(os.path.join(os.path.dirname(page), link))
            rel_root = os.path.relpath(target, root)
            if (
                target in seen
                or not os.path.isfile(target)
                or target == docs_dir
                or target.startswith(docs_dir + os.sep)
                or rel_root.startswith("..")
                or any(part.startswith(".") for part in rel_root.split(os.sep))
            ):
                continue
            seen.add(target)
            src_uri = os.path.relpath(target, docs_dir).replace(os.sep, "/")  # "../figures/x.png"
            dest = File(f"{PREFIX}/{rel_root.replace(os.sep, '/')}", docs_dir, site_dir, urls)
            # explicitly in the site ("../" would match the default exclusion of dot paths), and
            # out of the nav without a note
            files.append(File(src_uri, docs_dir, site_dir, urls, dest_uri=dest.dest_uri,
                              inclusion=InclusionLevel.NOT_IN_NAV))
            if target.endswith(".md"):
                queue.append(target)
    return files
