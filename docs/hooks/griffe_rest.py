"""Griffe extension: make sitelens's reST-flavoured docstrings read well as Markdown.

The docstrings are prose with Sphinx roles (``:func:`fit_site```) and the odd reST simple table.
Before mkdocstrings renders them (``docstring_style: null``, so nothing is parsed into sections):

- a role becomes a code span: ``:func:`sitelens.site.fit_site``` -> ```sitelens.site.fit_site```
  (``~`` dropped);
- a reST simple table (a block between ``=== ===`` border lines) becomes a fenced text block, so
  its border lines are not read as Markdown heading underlines.
"""

from __future__ import annotations

import re

from griffe import Extension

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|mod|obj|exc|const|ref):`~?([^`]+)`")
_BORDER = re.compile(r"^\s*=+(?: +=+)+\s*$")


def _fence_tables(text: str) -> str:
    lines = text.split("\n")
    borders = [i for i, line in enumerate(lines) if _BORDER.match(line)]
    if len(borders) < 2:
        return text
    first, last = borders[0], borders[-1]
    return "\n".join(lines[:first] + ["```text"] + lines[first : last + 1] + ["```"] + lines[last + 1 :])


def rewrite(text: str) -> str:
    """The docstring ``text`` with roles as code spans and simple tables fenced."""
    return _fence_tables(_ROLE.sub(r"`\1`", text))


class RestToMarkdown(Extension):
    """Rewrite every docstring once, when griffe creates its object."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
