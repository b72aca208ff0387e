"""Check every number README.md and docs/*.md quote from a result against its committed source.

``docs/claims.toml`` holds one ``[[claim]]`` per quoted number: where the value lives in a
committed results file, how it is rendered, and the text around it on each page that quotes it.
This script recomputes each value from its file, renders it, and fails when:

- a quoting page does not contain the quote with the value rendered exactly (a number changed by
  hand, or a results file regenerated without updating the page);
- the paragraph or list item holding a quote, or failing that its section, does not link the
  claim's source file (a reader must be able to follow every number to its file);
- a paragraph or list item that links a results file (``benchmarks/results/…``, ``figures/…``,
  the atlas tables ``sitelens/data/atlas/…`` (a link to the cited numbers, ``benchmarks/cited.csv``,
  lets a quote of one follow it to its source, and is not such a link),
  or any block of a section the table marks ``[[coverage]]``, holds a number that no claim quotes
  and no ``[[ignore]]`` entry names as a setting (so a new quote cannot drift in unchecked). Blocks
  listed as ``[[exempt]]`` (by the start of their text) are not yet covered and are skipped; a
  ``[[coverage]]`` entry's ``blocks`` (starts of text) forces blocks without a link to be covered;
- any other block of any page (code fences aside) holds a number that looks like a result — one
  with a decimal point, an exponent (``5e5``), a ``k`` (``262k``) or a unit after it (``%``, ``×``,
  ``s``, ``ms``, ``h``, ``MB``, ``GB``, ``points``) — that no claim quotes and no ``[[ignore]]``
  names (a result quoted without a link to its file is an error, not a blind spot). Counts and
  settings without a unit (``8 tasks``, ``seed 0``) are checked only in the blocks above.

Locating a value (one of):

- ``csv = {where = {col = value | [values]}, where_not = {...}, at_least = {col = number},
  at_most = {...}, column = "c" | ["x", "y"], by = "g" | ["g", "h"], within = "mean",
  agg = "value" | "mean" | "median" | "min" | "max" | "sum" | "count" | "nunique" | "spearman",
  contrast = [{col = a}, {col = b}], op = "difference" | "ratio"}``
  on a CSV file (``value``: exactly one row; ``spearman``: rank correlation of two columns over the
  rows where both are numbers; ``at_least``/``at_most`` keep the rows whose column is a number ≥ / ≤
  the bound; ``by``: the column's ``within`` (``mean`` unless named: ``sum``, ``min``, …) in each
  group of rows first, then ``agg`` over the groups' values — a mean over tasks of per-task
  means, a median over repeats of per-repeat sums (``spearman`` with ``by``: the mean of the
  groups' rank correlations, over the groups of at least 3 rows where both columns vary);
  ``pair = [{col = a}, {col = b}], on = "k"``: the Pearson r of the column between the two sets of
  rows, matched on ``k``; ``contrast``: the aggregate over the rows
  also matching the first ``where`` minus (or divided by) the one over the second's — a difference
  of means, a ratio of medians; ``True``/``False`` count as 1/0);
- ``table = {section = "…", where = {...}, column = "c"}``: a cell of a markdown table of the source
  (the first table under a heading containing ``section`` with those columns; exactly one row);
- ``regex = "…"``: the first group of the first match in the source text;
- ``json = ["key", 0, …]``: a path into a JSON source;
- ``expr = "a / b"`` with ``args = {a = "claim.id", …}``: arithmetic on other claims' unrounded
  values (the claim's sources are theirs).

``links = ["…"]`` names other files a quoting page may link instead of the source (the report that
shows the source's rows).

Rendering: ``format(value * scale, fmt)`` (``scale`` defaults to 1), a negative sign written as
U+2212 (``−``) unless ``minus = "-"``. A quote is ``"PAGE: text with {v}"``; whitespace runs are
compared as one space, so a quote may span a line break of the page.

Usage: ``python scripts/check_claims.py [--root DIR] [--claims FILE] [--list]``; exit status 1 on
any error, each printed on one line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, which pytest requires there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MINUS = "\u2212"
# A results link: the quoting sentence must let a reader follow the number to its file.
RESULTS_LINK = re.compile(
    r"\]\((?:\.\./)?((?:benchmarks/results|figures|sitelens/data/atlas)/[^)#\s]+|benchmarks/cited\.csv)")
# Numbers measured elsewhere: a quote of one links this table; the link alone does not make its
# paragraph a results paragraph (its counts and settings are checked as in any other block).
CITED = "benchmarks/cited.csv"
# A number as a reader sees one: not part of a word or a name (SmolLM2, L14H1, top-10, 270M, 3.1-8B).
# Exponents (5e5, 1.26e-4) and thousands (262k) are one number; a decimal is never read in part.
NUMBER = re.compile(r"(?<![\w.])(?<![A-Za-z]-)[−-]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:[eE][−+-]?\d+|k)?(?!\w|\.\d)")
# A number that reads as a measurement, not a count or a setting: checked in every block of a page.
RESULT_LIKE = re.compile(r"[.eEk]")
RESULT_UNIT = re.compile(r"\s?(?:%|×|(?:s|ms|min|h|seconds?|minutes?|hours?|days?|MB|GB|GiB|points?|pp)\b)")
INLINE_SKIP = re.compile(r"`[^`]*`|\]\([^)]*\)|<[^>]+>|https?://\S+")


@dataclass
class Block:
    """One paragraph, top-level list item (with everything nested in it) or table of a page."""

    page: str
    section: str
    text: str  # whitespace runs collapsed to one space
    links: set[str] = field(default_factory=set)
    kind: str = "text"


def normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def blocks_of(page: str, text: str) -> list[Block]:
    """Split a markdown page into blocks; code fences and headings are left out."""
    out: list[Block] = []
    section, cur, kind, fence = "", [], "text", False

    def flush():
        nonlocal cur
        if cur:
            raw = "\n".join(cur)
            links = set(RESULTS_LINK.findall(raw))
            out.append(Block(page, section, normalize(raw), {_clean(p) for p in links}, kind))
        cur = []

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            flush()
            fence = not fence
            continue
        if fence:
            continue
        if line.startswith("#"):
            flush()
            section = line.lstrip("#").strip()
            continue
        if not line.strip():
            flush()
            continue
        is_table = line.lstrip().startswith("|")
        top_item = re.match(r"(?:[-*+]|\d+\.) ", line) is not None
        if cur and (top_item or is_table != (kind == "table")):
            flush()
        if not cur:
            kind = "table" if is_table else "text"
        cur.append(line)
    flush()
    return out


def _clean(path: str) -> str:
    return path.rstrip("/")


class Sources:
    """Committed results files, read once."""

    def __init__(self, root: Path):
        self.root = root
        self._text: dict[str, str] = {}
        self._csv: dict[str, pd.DataFrame] = {}

    def text(self, path: str) -> str:
        if path not in self._text:
            self._text[path] = (self.root / path).read_text(encoding="utf-8")
        return self._text[path]

    def csv(self, path: str) -> pd.DataFrame:
        if path not in self._csv:
            self._csv[path] = pd.read_csv(self.root / path, dtype=str, keep_default_na=False)
        return self._csv[path]


def _filter(df: pd.DataFrame, where: dict, where_not: dict, at_least: dict | None = None,
            at_most: dict | None = None) -> pd.DataFrame:
    for col, want in where.items():
        want = [str(w) for w in (want if isinstance(want, list) else [want])]
        df = df[df[col].astype(str).str.strip().isin(want)]
    for col, drop in where_not.items():
        drop = [str(w) for w in (drop if isinstance(drop, list) else [drop])]
        df = df[~df[col].astype(str).str.strip().isin(drop)]
    for col, bound in (at_least or {}).items():
        df = df[_numbers(df[col]) >= float(bound)]
    for col, bound in (at_most or {}).items():
        df = df[_numbers(df[col]) <= float(bound)]
    return df


def _numbers(col: pd.Series) -> pd.Series:
    """A column as numbers: thousands separators dropped, True/False as 1/0, anything else NaN."""
    s = col.astype(str).str.strip().str.replace(",", "").replace({"True": "1", "False": "0"})
    return pd.to_numeric(s, errors="coerce")


def _number(s) -> float:
    s = str(s).strip().replace(",", "").replace(MINUS, "-").strip("*%×")
    return float(s)


def _aggregate(df: pd.DataFrame, spec: dict) -> float:
    agg = spec.get("agg", "value")
    col = spec.get("column")
    if agg == "count":
        return float(len(df))
    if agg == "nunique":
        return float(df[col].nunique())
    if agg == "spearman":
        if "by" not in spec:
            return _spearman(df, col)
        per_group = [_spearman(g, col) for _, g in df.groupby(spec["by"])]
        per_group = [r for r in per_group if r == r]
        if not per_group:
            raise ValueError("no group with a rank correlation")
        return float(sum(per_group) / len(per_group))
    if "by" in spec:
        by = spec["by"] if isinstance(spec["by"], list) else [spec["by"]]
        within = spec.get("within", "mean")
        df = df.assign(**{col: _numbers(df[col])}).groupby(by)[col].agg(within).reset_index()
    vals = _numbers(df[col]).dropna()
    if agg == "value":
        if len(df) != 1:
            raise ValueError(f"{len(df)} rows match, expected exactly one")
        return _number(df[col].iloc[0])
    if vals.empty:
        raise ValueError("no numeric value in the matching rows")
    return float(getattr(vals, agg)())


def _spearman(df: pd.DataFrame, cols: list[str]) -> float:
    """Rank correlation of two columns over the rows where both are numbers (NaN below 3 rows)."""
    x, y = (_numbers(df[c]) for c in cols)
    ok = x.notna() & y.notna()
    return float(x[ok].rank().corr(y[ok].rank())) if ok.sum() >= 3 else float("nan")


def md_tables(text: str) -> list[tuple[str, pd.DataFrame]]:
    """Every markdown table of ``text`` with the heading above it."""
    tables, heading, rows = [], "", []

    def close():
        if len(rows) >= 2:
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            body = [r for r in cells[2:] if len(r) == len(cells[0])]
            tables.append((heading, pd.DataFrame(body, columns=cells[0])))
        rows.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            rows.append(line)
            continue
        close()
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
    close()
    return tables


def value_of(claim: dict, claims: dict[str, dict], src: Sources, seen: tuple = ()) -> float:
    """The claim's unrounded value, recomputed from its source."""
    if "expr" in claim:
        if claim["id"] in seen:
            raise ValueError("claims refer to each other in a cycle")
        env = {k: value_of(claims[v], claims, src, seen + (claim["id"],)) for k, v in claim["args"].items()}
        return float(eval(claim["expr"], {"__builtins__": {}, "abs": abs, "min": min, "max": max}, env))
    path = claim["source"]
    if "csv" in claim:
        spec = claim["csv"]
        def agg(extra: dict) -> float:
            df = _filter(src.csv(path), {**spec.get("where", {}), **extra}, spec.get("where_not", {}),
                         spec.get("at_least"), spec.get("at_most"))
            return _aggregate(df, spec)

        if "pair" in spec:  # Pearson r of one column between two sets of rows matched on ``on``
            a, b = (_filter(src.csv(path), {**spec.get("where", {}), **w}, {})
                    .set_index(spec["on"])[spec["column"]] for w in spec["pair"])
            both = pd.concat([_numbers(a), _numbers(b)], axis=1, join="inner").dropna()
            if len(both) < 3:
                raise ValueError(f"{len(both)} matched rows for a correlation, expected at least 3")
            return float(both.iloc[:, 0].corr(both.iloc[:, 1]))
        if "contrast" in spec:
            ops = {"difference": lambda a, b: a - b, "ratio": lambda a, b: a / b}
            if spec.get("op") not in ops:
                raise ValueError(f"contrast needs op = 'difference' or 'ratio', not {spec.get('op')!r}")
            return float(ops[spec["op"]](*(agg(c) for c in spec["contrast"])))
        return agg({})
    if "table" in claim:
        spec = claim["table"]
        need = {spec["column"], *spec.get("where", {})}
        for heading, df in md_tables(src.text(path)):
            if spec.get("section", "") in heading and need <= set(df.columns):
                hit = _filter(df, spec.get("where", {}), {})
                if len(hit):
                    return _aggregate(hit, {"agg": spec.get("agg", "value"), "column": spec["column"]})
        raise ValueError(f"no table row in {path} matches {spec}")
    if "regex" in claim:
        m = re.search(claim["regex"], src.text(path))
        if not m:
            raise ValueError(f"regex {claim['regex']!r} does not match {path}")
        return _number(m.group(1))
    if "json" in claim:
        node = json.loads(src.text(path))
        for key in claim["json"]:
            node = node[key]
        return float(node)
    raise ValueError("no locator (csv, table, regex, json or expr)")


def _links_source(links: set[str], source: str) -> bool:
    """A page links ``source``, or the markdown report beside it whose name starts its name
    (``site_fv.md`` for ``site_fv_gemma-3-270m.csv``, ``fit_time.md`` for ``fit_time_….csv``)."""
    if source in links:
        return True
    folder, _, name = source.rpartition("/")
    stem = name.rsplit(".", 1)[0]
    for link in links:
        lf, _, ln = link.rpartition("/")
        if lf == folder and ln.endswith(".md") and stem.startswith(ln[:-3]):
            return True
    return False


def sources_of(claim: dict, claims: dict[str, dict]) -> set[str]:
    if "expr" in claim:
        return set().union(*(sources_of(claims[v], claims) for v in claim["args"].values()))
    return {claim["source"]}


def links_of(claim: dict, claims: dict[str, dict]) -> set[str]:
    """The files a quoting page may link for the claim: its sources, and its ``links`` (the report
    that shows the source's rows, e.g. ``cls_report.md`` for ``cls_….csv``)."""
    own = set(claim.get("links", []))
    if "expr" in claim:
        return own.union(*(links_of(claims[v], claims) for v in claim["args"].values()))
    return own | {claim["source"]}


def render(value: float, claim: dict) -> str:
    s = format(value * claim.get("scale", 1), claim["fmt"])
    if re.fullmatch(r"-0?\.?0*", s.rstrip("%")):  # a rounded zero carries no sign
        s = s[1:]
    return s.replace("-", claim.get("minus", MINUS), 1) if s.startswith("-") else s


def _span_of_quote(block: Block, quote: str, rendered: str) -> list[tuple[int, int]]:
    """Where ``{v}`` lands in each occurrence of the rendered quote in ``block``."""
    before, _, after = normalize(quote).partition("{v}")
    full = before + rendered + after
    spans, start = [], block.text.find(full)
    while start >= 0:
        spans.append((start + len(before), start + len(before) + len(rendered)))
        start = block.text.find(full, start + 1)
    return spans


def _what_page_says(blocks: list[Block], quote: str) -> str | None:
    before, _, after = normalize(quote).partition("{v}")
    pat = re.compile(re.escape(before) + r"([−-]?\d[\d,.]*)" + re.escape(after))
    for b in blocks:
        m = pat.search(b.text)
        if m:
            return m.group(1)
    return None


# claim values already computed in this process: {(root, the claims, the sources' sizes and
# mtimes): {id: value or the error}}. tests/test_claims.py checks edited copies of the pages against
# the same claims many times; recomputing every value each time took most of its minutes.
_VALUES: dict[tuple, dict[str, float | Exception]] = {}


def claim_values(root: Path, claims: dict[str, dict]) -> dict[str, float | Exception]:
    """Every claim's value (:func:`value_of`) or the error computing it; reused while the claims
    and every source file (size and modification time) stay the same."""
    paths: set[str] = set()
    for claim in claims.values():
        try:
            paths |= sources_of(claim, claims)
        except (KeyError, TypeError):  # an expr naming no claim: value_of reports it
            pass
    stamps = []
    for path in sorted(paths):
        try:
            st = (root / path).stat()
            stamps.append((path, st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append((path, None, None))
    key = (str(root), json.dumps(claims, sort_keys=True, default=str), tuple(stamps))
    if key not in _VALUES:
        src, values = Sources(root), {}
        for cid, claim in claims.items():
            try:
                values[cid] = value_of(claim, claims, src)
            except (KeyError, ValueError, OSError, IndexError, TypeError) as e:
                values[cid] = e
        _VALUES.clear()  # one set of values is all a run needs
        _VALUES[key] = values
    return _VALUES[key]


def check(root: Path = ROOT, claims_path: Path | None = None,
          pages: dict[str, str] | None = None) -> list[str]:
    """All errors (empty when every quoted number matches its source). ``pages`` overrides the text
    of named pages (a path relative to ``root`` → text), to check an edited copy."""
    claims_path = claims_path or root / "docs" / "claims.toml"
    table = tomllib.loads(claims_path.read_text(encoding="utf-8"))
    claims = {c["id"]: c for c in table.get("claim", [])}
    values = claim_values(root, claims)
    errors: list[str] = []
    page_names = sorted({"README.md", *(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))})
    texts = {p: (pages or {}).get(p) or (root / p).read_text(encoding="utf-8") for p in page_names}
    blocks = {p: blocks_of(p, t) for p, t in texts.items()}
    covered: dict[tuple[str, int], list[tuple[int, int]]] = {}

    for cid, claim in claims.items():
        value = values[cid]
        if isinstance(value, Exception):
            errors.append(f"claim {cid}: cannot compute its value: {type(value).__name__}: {value}")
            continue
        rendered = render(value, claim)
        srcs = sources_of(claim, claims)
        linkable = links_of(claim, claims)
        for q in claim.get("quotes", []):
            page, _, quote = q.partition(": ")
            if page not in blocks:
                errors.append(f"claim {cid}: no page {page}")
                continue
            found = False
            for i, b in enumerate(blocks[page]):
                spans = _span_of_quote(b, quote, rendered)
                if not spans:
                    continue
                found = True
                covered.setdefault((page, i), []).extend(spans)
                sec_links = set().union(*(x.links for x in blocks[page] if x.section == b.section))
                if not any(_links_source(b.links | sec_links, s) for s in linkable):
                    errors.append(f"{page}: {quote.replace('{v}', rendered)!r} (claim {cid}) does not link "
                                  f"its source {' or '.join(sorted(srcs))} in its paragraph or section")
            if not found:
                says = _what_page_says(blocks[page], quote)
                detail = f"; the page says {says}" if says else "; the quote's text is not on the page"
                errors.append(f"{page}: expected {quote.replace('{v}', rendered)!r} (claim {cid} = "
                              f"{value:.6g} from {', '.join(sorted(srcs))}){detail}")

    errors += _coverage(table, blocks, covered)
    return errors


def _coverage(table: dict, blocks: dict[str, list[Block]], covered) -> list[str]:
    """Numbers in checked blocks that no claim quotes and no ignore entry names."""
    global_ignore = [re.compile(p) for p in table.get("settings", {}).get("ignore", [])]
    page_ignore: dict[str, list[str]] = {}
    for ig in table.get("ignore", []):
        page_ignore.setdefault(ig["page"], []).extend(normalize(t) for t in ig["texts"])
    whole = {(c["page"], s) for c in table.get("coverage", []) for s in c.get("sections", [])}
    starts = [(c["page"], normalize(s)) for c in table.get("coverage", []) for s in c.get("blocks", [])]
    exempt = [(e["page"], normalize(e["prefix"])) for e in table.get("exempt", [])]
    errors = []
    for page, bl in blocks.items():
        for i, b in enumerate(bl):
            forced = any(p == page and b.text.startswith(s) for p, s in starts)
            full = bool(b.links - {CITED} or forced or (page, b.section) in whole)
            if any(p == page and b.text.startswith(pre) for p, pre in exempt):
                continue
            ok = list(covered.get((page, i), []))
            for rx in global_ignore:
                ok += [m.span() for m in rx.finditer(b.text)]
            for t in page_ignore.get(page, []):
                start = b.text.find(t)
                while start >= 0:
                    ok.append((start, start + len(t)))
                    start = b.text.find(t, start + 1)
            ok += [m.span() for m in INLINE_SKIP.finditer(b.text)]
            for m in NUMBER.finditer(b.text):
                if any(s <= m.start() and m.end() <= e for s, e in ok):
                    continue
                ctx = b.text[max(0, m.start() - 40):m.end() + 20]
                if full:
                    errors.append(f"{page} [{b.section}]: number {m.group()!r} has no claim (…{ctx}…)")
                elif looks_like_result(b.text, m):
                    errors.append(f"{page} [{b.section}]: number {m.group()!r} looks like a result but has "
                                  f"no claim (link its source and add one, or [[ignore]] it) (…{ctx}…)")
    return errors


def looks_like_result(text: str, m: re.Match) -> bool:
    """A number with a decimal point, an exponent or a ``k``, or a unit after it (``52%``, ``7.5×``,
    ``59.9 s``): a measurement rather than a count or a setting."""
    return bool(RESULT_LIKE.search(m.group().lstrip("−-"))) or RESULT_UNIT.match(text, m.end()) is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--claims", type=Path, default=None)
    ap.add_argument("--list", action="store_true", help="print each claim's id, value and source")
    args = ap.parse_args(argv)
    if args.list:
        claims_path = args.claims or args.root / "docs" / "claims.toml"
        claims = {c["id"]: c for c in tomllib.loads(claims_path.read_text(encoding="utf-8"))["claim"]}
        src = Sources(args.root)
        for cid, c in claims.items():
            print(f"{cid}\t{render(value_of(c, claims, src), c)}\t{', '.join(sorted(sources_of(c, claims)))}")
    errors = check(args.root, args.claims)
    for e in errors:
        print(e)
    n = len(tomllib.loads((args.claims or args.root / "docs" / "claims.toml").read_text("utf-8"))["claim"])
    print(f"check_claims: {n} claims, {len(errors)} error(s)", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
