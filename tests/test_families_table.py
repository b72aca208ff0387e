"""The architecture-family support table (scripts/families_table.py, docs/models.md): rendered from
JUnit results, never by hand, and the committed one is all green or says why not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sitelens.models.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "families_table.py"


@pytest.fixture(scope="module")
def ft():
    spec = importlib.util.spec_from_file_location("families_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _xml(cases: list[str]) -> str:
    return "<testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>"


def _row(table: str, family: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| `{family}` |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_render_marks_passes_failures_skips_and_the_attention_path(ft, tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(_xml([
        '<testcase name="test_hooks_and_z_shapes[gpt-j]"/>',
        '<testcase name="test_fused_attention_equals_transformerlens_or_falls_back[gpt-j]">'
        '<properties><property name="attention" value="slow path: ALiBi"/></properties></testcase>',
        '<testcase name="test_kv_cached_generation_equals_uncached[plain-gpt-j]"/>',
        '<testcase name="test_kv_cached_generation_equals_uncached[injected-gpt-j]">'
        '<failure message="x"/></testcase>',
        '<testcase name="test_injection_at_the_last_token[gpt-j]"><skipped/></testcase>',
        '<testcase name="test_planted_bug_fails_the_family_suite[gpt-j-rotary_fraction_ignored]">'
        '<properties><property name="caught_by" value="attention"/></properties></testcase>',
        '<testcase name="test_planted_bug_fails_the_family_suite[gpt-j-parallel_block_run_serially]">'
        '<failure message="x"/></testcase>',
        '<testcase name="test_hooks_and_z_shapes[gpt-neo]"><error message="x"/></testcase>',
    ]))
    table = ft.render(ft.parse_junit([xml]))
    cols = list(ft.COLUMNS)
    row = dict(zip(["family", "arch", "features", *cols, "bridge", "bugs"], _row(table, "gpt-j"),
                   strict=True))
    assert row["bridge"] == "–"  # no bridge results given
    assert row["hooks"] == "✓" and row["attention"] == "✓ slow path: ALiBi"
    assert row["KV cache"] == "✗"  # one of its two cases failed
    assert row["injection"] == "–" and row["patching"] == "–"  # skipped, not run
    assert row["bugs"] == ("parallel block run serially (NOT caught); "
                           "rotary fraction ignored → attention")
    assert _row(table, "gpt-neo")[3] == "✗"  # an error is a failure
    assert "not built:" in _row(table, "falcon")[2]


def test_the_bridge_column_from_the_bridge_suite(ft, tmp_path):
    """✓ when all the bridge checks of a family passed, ✗ naming the failed ones, "not built: why"
    where the suite skipped the family, – where it did not run; unsupported families get it too."""
    xml = tmp_path / "b.xml"
    xml.write_text(_xml([
        '<testcase name="test_hooks_and_z_shapes[qwen2]"/>',
        '<testcase name="test_kv_cached_generation_equals_uncached[plain-qwen2]"/>',
        '<testcase name="test_hooks_and_z_shapes[gpt2]"/>',
        '<testcase name="test_kv_cached_generation_equals_uncached[injected-gpt2]">'
        '<failure message="x"/></testcase>',
        '<testcase name="test_hooks_and_z_shapes[falcon]"/>',
        '<testcase name="test_hooks_and_z_shapes[bloom]">'
        '<skipped message="TransformerBridge cannot wrap BloomForCausalLM"/></testcase>',
    ]))
    table = ft.render(ft.parse_junit([]), ft.parse_junit([xml]))
    at = 3 + len(ft.COLUMNS)
    assert _row(table, "qwen2")[at] == "✓"
    assert _row(table, "gpt2")[at] == "✗ kv_cached_generation_equals_uncached"
    assert _row(table, "bloom")[at] == "not built: TransformerBridge cannot wrap BloomForCausalLM"
    assert _row(table, "opt")[at] == "–"
    assert _row(table, "falcon")[at] == "✓"  # not built as a HookedTransformer, on the bridge yes


def test_bridge_planted_bugs_fill_the_cell_of_the_families_only_the_bridge_builds(ft, tmp_path):
    """The planted-bugs cell of a family TransformerLens 3.9 cannot build comes from the bridge's
    planted bugs (marked "(bridge)"); a built family's cell stays the HookedTransformer one's."""
    xml = tmp_path / "b.xml"
    case = '<testcase name="test_planted_bug_fails_the_bridge_family_suite[{}]">{}</testcase>'
    xml.write_text(_xml([
        case.format("falcon-injection_one_position_early",
                    '<properties><property name="caught_by" value="injection"/></properties>'),
        case.format("falcon-AtP_of_the_wrong_metric",
                    '<properties><property name="caught_by" value="lenses"/></properties>'
                    '<failure message="x"/>'),
        case.format("llama-gradient_of_the_wrong_metric",
                    '<properties><property name="caught_by" value="lenses"/></properties>'),
    ]))
    table = ft.render(ft.parse_junit([]), ft.parse_junit([xml]))
    assert _row(table, "falcon")[-1] == ("AtP of the wrong metric → lenses (bridge) (NOT caught); "
                                         "injection one position early → injection (bridge)")
    assert _row(table, "starcoder2")[-1] == "–"  # none ran
    assert _row(table, "llama")[-1] == "–"  # built: its cell reads the HookedTransformer suite
    assert ft.BRIDGE_MUTATION_TEST in " ".join(ft.BRIDGE_SUITES)  # the bridge run includes them


def test_the_section_is_replaced_and_nothing_else(ft):
    doc = f"intro\n{ft.START}\nold\n{ft.END}\noutro\n"
    assert ft.replace_section(doc, "new\n") == f"intro\n{ft.START}\nnew\n{ft.END}\noutro\n"
    with pytest.raises(SystemExit):
        ft.replace_section("no markers", "new\n")


def test_the_committed_table_is_green_or_says_why_not(ft):
    doc = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    table = doc.split(ft.START, 1)[1].split(ft.END, 1)[0]
    for name, fam in FAMILIES.items():
        row = _row(table, name)
        bridge = row[3 + len(ft.COLUMNS)]
        assert bridge.startswith(("✓", "not built: ")), (name, bridge)
        if not fam.supported:
            assert row[2] == f"not built: {fam.unsupported}"
            assert row[-1] != "–" and "NOT caught" not in row[-1], (name, row[-1])
            assert all(b.endswith("(bridge)") for b in row[-1].split("; ")), (name, row[-1])
            continue
        checks = row[3:3 + len(ft.COLUMNS)]
        assert all(c.startswith("✓") for c in checks), (name, checks)
        assert row[-1] != "–" and "NOT caught" not in row[-1], (name, row[-1])
    rows = [x for x in table.splitlines() if x.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == list(FAMILIES)  # every family, in the data's order
