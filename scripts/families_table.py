"""Write the architecture-family support table of docs/models.md from the family suite's results.

The table is never edited by hand: this script runs ``tests/test_families.py`` and
``tests/test_family_mutations.py`` under pytest with ``--junitxml`` (or reads JUnit XML files given
with ``--junit``), reads one outcome per (check, family) and the attention path each family took
(a ``record_property`` of the attention check), and replaces the text between the two
``families-table`` markers of docs/models.md. A check that failed shows ✗, one that did not run
shows –. Families TransformerLens 3.9 cannot build get a row with the reason
(``sitelens.models.families.FAMILIES``). These HookedTransformer suites run under the TransformerLens
3.9 venv of the second CI job (``.venv-tl39/bin/python``, ``--hooked-python``).

The "bridge (TL 4)" column comes from ``tests/test_families_bridge.py`` run by the TransformerLens 4
venv of the main CI job (``.venv/bin/python``, ``SITELENS_BACKEND=bridge``; or JUnit files
given with ``--bridge-junit``). The same run covers the bridge's planted bugs
(``tests/test_family_mutations.py::test_planted_bug_fails_the_bridge_family_suite``): they fill the
"planted bugs caught" cell of the families only the bridge builds, marked "(bridge)".

Usage: ``python scripts/families_table.py [--junit FILE ...] [--bridge-junit FILE ...]
[--hooked-python PY] [--bridge-python PY] [--doc docs/models.md] [--check]``;
``--check`` writes nothing and exits 1 when the page's table differs from the results.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = "<!-- families-table: start (scripts/families_table.py writes this; do not edit) -->"
END = "<!-- families-table: end -->"
SUITES = ("tests/test_families.py", "tests/test_family_mutations.py")

# table column -> the check of tests/test_families.py behind it
COLUMNS = {
    "hooks": "test_hooks_and_z_shapes",
    "attention": "test_fused_attention_equals_transformerlens_or_falls_back",
    "injection": "test_injection_at_the_last_token",
    "KV cache": "test_kv_cached_generation_equals_uncached",
    "SITE + adapter": "test_site_fit_evaluate_and_adapter_round_trip",
    "patching": "test_head_effects_equal_a_generic_activation_patch_reference",
    "lenses": "test_alpha_gradient_is_exact_and_lenses_run",
    "bfloat16": "test_bfloat16_within_bounds_of_float32",
}
MUTATION_TEST = "test_planted_bug_fails_the_family_suite"
# the bridge column: tests/test_families_bridge.py, run by the TransformerLens 4 venv of the main job,
# with the bridge's planted bugs (the planted-bugs cell of the families only the bridge builds)
BRIDGE_SUITE = "tests/test_families_bridge.py"
BRIDGE_MUTATION_TEST = "test_planted_bug_fails_the_bridge_family_suite"
BRIDGE_SUITES = (BRIDGE_SUITE, f"tests/test_family_mutations.py::{BRIDGE_MUTATION_TEST}")
BRIDGE_TESTS = ("test_hooks_and_z_shapes", "test_injection_at_the_last_token",
                "test_kv_cached_generation_equals_uncached",
                "test_site_fit_evaluate_and_adapter_round_trip",
                "test_head_effects_equal_a_generic_activation_patch_reference",
                "test_alpha_gradient_is_exact_and_lenses_run",
                "test_bfloat16_within_bounds_of_float32")
BRIDGE_PYTHON = ROOT / ".venv" / "bin" / "python"  # TransformerLens 4 (scripts/setup.sh)
HOOKED_PYTHON = ROOT / ".venv-tl39" / "bin" / "python"  # TransformerLens 3.9 (scripts/test_tl39.sh)
CASE = re.compile(r"^(?P<test>\w+)\[(?P<params>.*)\]$")


def parse_junit(paths) -> dict:
    """``{(test, params): {"ok": bool | None, "props": {name: value}}}`` from JUnit XML files
    (``ok`` None: skipped)."""
    out = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            m = CASE.match(case.get("name", ""))
            if not m:
                continue
            tags = {child.tag for child in case}
            ok = None if "skipped" in tags else not ({"failure", "error"} & tags)
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            skip = case.find("skipped")
            if skip is not None:
                props["skipped"] = (skip.get("message") or "").removeprefix("Skipped: ")
            key = (m["test"], m["params"])
            prev = out.get(key)
            if prev is not None and prev["ok"] is False:
                ok = False  # a failing setup or teardown keeps the case failed
            out[key] = {"ok": ok, "props": {**(prev or {}).get("props", {}), **props}}
    return out


def _mark(outcomes: list) -> str:
    if not outcomes or all(o is None for o in outcomes):
        return "–"
    return "✗" if any(o is False for o in outcomes) else "✓"


def _family_cases(results: dict, test: str, family: str) -> list[tuple[str, dict]]:
    """The cases of ``test`` for ``family``: ids ``family`` or ``other-family`` (checks), or
    ``family-bug`` (the planted bugs)."""
    if test in (MUTATION_TEST, BRIDGE_MUTATION_TEST):
        return [(params[len(family) + 1:], r) for (t, params), r in results.items()
                if t == test and params.startswith(f"{family}-")]
    return [(params, r) for (t, params), r in results.items()
            if t == test and (params == family or params.endswith(f"-{family}"))]


def bridge_cell(bridge: dict | None, family: str) -> str:
    """The bridge column of ``family`` from the bridge suite's results: ✓ when every check passed,
    ✗ and the failed checks, "not built: <why>" where the suite skipped the family, – not run."""
    if bridge is None:
        return "–"
    cases = [(t, r) for t in BRIDGE_TESTS for _, r in _family_cases(bridge, t, family)]
    if not cases:
        return "–"
    failed = sorted({t.removeprefix("test_") for t, r in cases if r["ok"] is False})
    if failed:
        return "✗ " + ", ".join(failed)
    skipped = [(t, r["props"].get("skipped", "")) for t, r in cases if r["ok"] is None]
    if skipped and len(skipped) == len(cases):
        return f"not built: {skipped[0][1]}"
    mark = _mark([r["ok"] for _, r in cases])
    for t, why in sorted(set(skipped)):  # a check the suite marks as a known bridge failure
        mark += f"; {t.removeprefix('test_')} not run ({why})"
    return mark


def bugs_cell(results: dict | None, test: str, family: str, where: str = "") -> str:
    """The planted bugs of ``family`` in ``results`` of ``test``: "bug → the check that caught it"
    (its ``caught_by`` property, followed by ``where``), "(NOT caught)" when the bug went unnoticed;
    – when none ran."""
    bugs = []
    for bug, r in sorted(_family_cases(results or {}, test, family)):
        by = r["props"].get("caught_by")
        bugs.append(bug.replace("_", " ") + (f" → {by}{where}" if by else "")
                    + ("" if r["ok"] else " (NOT caught)"))
    return "; ".join(bugs) or "–"


def render(results: dict, bridge: dict | None = None) -> str:
    """The markdown table (and its legend) for ``results`` from :func:`parse_junit` (the
    HookedTransformer suites) and ``bridge`` (the bridge suite on TransformerLens 4)."""
    from sitelens.models.families import FAMILIES

    head = ["family", "architecture (settings of)", "features", *COLUMNS, "bridge (TL 4)",
            "planted bugs caught"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fam in FAMILIES.values():
        first = f"`{fam.name}`"
        arch = f"`{fam.architecture}` (`{fam.source}`)"
        if not fam.supported:
            bugs = bugs_cell(bridge, BRIDGE_MUTATION_TEST, fam.name, " (bridge)")
            lines.append(f"| {first} | {arch} | not built: {fam.unsupported} |"
                         + " |" * len(COLUMNS) + f" {bridge_cell(bridge, fam.name)} | {bugs} |")
            continue
        cells = []
        for col, test in COLUMNS.items():
            cases = _family_cases(results, test, fam.name)
            mark = _mark([r["ok"] for _, r in cases])
            if col == "attention" and cases:
                path = next((r["props"].get("attention") for _, r in cases
                             if r["props"].get("attention")), None)
                mark = f"{mark} {path}" if path else mark
            cells.append(mark)
        bugs = bugs_cell(results, MUTATION_TEST, fam.name)
        lines.append(f"| {first} | {arch} | {', '.join(fam.features)} | " + " | ".join(cells)
                     + f" | {bridge_cell(bridge, fam.name)} | {bugs} |")
    legend = ("✓ passed, ✗ failed, – not run. Checks (`tests/test_families.py`): "
              + "; ".join(f"{col}: `{test}`" for col, test in COLUMNS.items())
              + f". Planted bugs (`tests/test_family_mutations.py::{MUTATION_TEST}`): each "
              "bug → the check it fails. The check columns: HookedTransformer on TransformerLens "
              f"3.9. bridge (TL 4): `{BRIDGE_SUITE}` (the tiny Hugging Face model of the family "
              "from its own config class, saved to a folder and loaded with "
              "`load_model(DIR, backend=\"bridge\")`) on TransformerLens 4: "
              + ", ".join(t.removeprefix("test_") for t in BRIDGE_TESTS) + ". Families only the "
              f"bridge builds: planted bugs of `tests/test_family_mutations.py::{BRIDGE_MUTATION_TEST}`"
              " on TransformerLens 4, each bug → the bridge check it fails (bridge).")
    return "\n".join(lines) + "\n\n" + legend + "\n"


def replace_section(doc: str, table: str) -> str:
    """``doc`` with the text between :data:`START` and :data:`END` replaced by ``table``."""
    if START not in doc or END not in doc:
        raise SystemExit(f"the page has no {START!r} … {END!r} section")
    before, rest = doc.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{table}{END}{after}"


def run_bridge_suite(out_dir: Path, python: Path) -> Path:
    """Run the bridge suite and the bridge's planted bugs under ``python`` (the main job's
    TransformerLens 4 venv) with ``SITELENS_BACKEND=bridge``; one JUnit file."""
    if not Path(python).is_file():
        raise SystemExit(f"{python} not found: the bridge column needs the TransformerLens 4 venv "
                         "(bash scripts/setup.sh creates it), or pass --bridge-junit FILE")
    xml = out_dir / "test_families_bridge.xml"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "SITELENS_BACKEND": "bridge"}
    subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *BRIDGE_SUITES,
                    f"--junitxml={xml}", "-o", "junit_family=xunit1"], cwd=ROOT, env=env, check=False)
    return xml


def run_suite(out_dir: Path, python: Path) -> list[Path]:
    """Run the family suites once under ``python`` (the 3.9 job's venv, with HookedTransformer),
    one JUnit file each (their failures are results, not errors)."""
    if not Path(python).is_file():
        raise SystemExit(f"{python} not found: the check columns need the TransformerLens 3.9 venv "
                         "(bash scripts/test_tl39.sh creates it), or pass --junit FILE")
    paths = []
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for suite in SUITES:
        xml = out_dir / (Path(suite).stem + ".xml")
        subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", suite,
                        f"--junitxml={xml}", "-o", "junit_family=xunit1"],
                       cwd=ROOT, env=env, check=False)
        paths.append(xml)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", nargs="*", type=Path, help="JUnit XML files (default: run the suites)")
    ap.add_argument("--bridge-junit", nargs="*", type=Path,
                    help="JUnit XML of tests/test_families_bridge.py and the bridge's planted bugs on "
                         "TransformerLens 4 (default: run them with --bridge-python)")
    ap.add_argument("--hooked-python", type=Path, default=HOOKED_PYTHON,
                    help="the TransformerLens 3.9 venv's python (default .venv-tl39/bin/python)")
    ap.add_argument("--bridge-python", type=Path, default=BRIDGE_PYTHON,
                    help="the TransformerLens 4 venv's python (default .venv/bin/python)")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "models.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the page differs; write nothing")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        paths = args.junit or run_suite(Path(tmp), args.hooked_python)
        bridge = args.bridge_junit or [run_bridge_suite(Path(tmp), args.bridge_python)]
        table = render(parse_junit(paths), parse_junit(bridge))
    doc = args.doc.read_text(encoding="utf-8")
    new = replace_section(doc, table)
    if args.check:
        if new != doc:
            print(f"{args.doc}: the families table differs from the suite's results; run "
                  "python scripts/families_table.py", file=sys.stderr)
            return 1
        return 0
    if new != doc:
        args.doc.write_text(new, encoding="utf-8")
    print(f"{args.doc}: families table written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
