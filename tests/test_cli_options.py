"""Every subcommand keeps its options and their defaults (issue 41, item 1).

``tests/data/cli_options.json`` was written from the parser before the command line was built
from config dataclasses: for each leaf command (``fit``, ..., ``patch intra``, ..., ``frontier``)
every option with its flags, default, choices, whether it is required and whether it is a flag.
The frontier was ``heads --frontier`` then: its entry holds the options that ``heads`` took with
``--frontier`` (all of ``heads``'s but ``--lenses``, ``--adapter`` and ``--frontier``), with
``--seeds`` at the default the frontier used (1); ``heads``'s entry holds those ``heads`` took
without ``--frontier``. Help text may change; options, defaults and choices may not (the one
intended change is in :data:`INTENDED`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sitelens.cli import build_parser

SNAPSHOT = Path(__file__).parent / "data" / "cli_options.json"


def leaf_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``{"fit": parser, ..., "patch intra": parser, ...}``: every leaf command of ``parser``."""
    def children(p):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                return dict(a.choices)
        return {}

    out = {}
    for name, p in children(parser).items():
        sub = children(p)
        out.update({f"{name} {n}": q for n, q in sub.items()} if sub else {name: p})
    return out


def options_of(p: argparse.ArgumentParser) -> dict[str, dict]:
    """``{"--flag": {"flags", "default", "choices", "required", "switch"}}`` of every option but
    ``--help``; a default as JSON keeps its value (an int subclass becomes its int)."""
    out = {}
    for a in p._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        default = a.default
        if isinstance(default, int) and not isinstance(default, bool):
            default = int(default)
        out[a.option_strings[-1]] = {
            "flags": list(a.option_strings), "default": default,
            "choices": None if a.choices is None else list(a.choices),
            "required": bool(a.required), "switch": a.nargs == 0,
        }
    return out


def current() -> dict[str, dict]:
    return {cmd: options_of(p) for cmd, p in sorted(leaf_parsers(build_parser()).items())}


# the changes made on purpose since the snapshot: heads's --lenses, optional while `heads --frontier`
# ran without it, is required now that the frontier is its own command
INTENDED = {("heads", "--lenses"): {"required": True}}
# options added since the snapshot: stage 2's schedule options (issue 44) on the commands that fit
# one adapter at a time (FitOptions; heads and frontier fit jointly and keep one schedule)
SCHEDULE = {"--eval-every": {"default": 10, "choices": None}, "--n-valid": {"default": 64, "choices": None},
            "--patience": {"default": 0, "choices": None},
            "--lr-rule": {"default": "fixed", "choices": ["fixed", "sqrt", "linear"]}}
ADDED = {cmd: {f: {"flags": [f], "required": False, "switch": False, **spec} for f, spec in SCHEDULE.items()}
         for cmd in ("fit", "run", "patch intra", "patch inter")}
# ... and bench's joint fits of the site cells (issue 44)
ADDED["bench"] = {"--joint": {"flags": ["--joint"], "required": False, "switch": False, "default": 1,
                              "choices": None}}
ADDED["figures"] = {"--joint": {"flags": ["--joint"], "required": False, "switch": True, "default": False,
                                "choices": None}}
# ... and the atlas's carry across a numerics bump (issue 42: the atlas at numerics 3)
ADDED["atlas"] = {"--carry": {"flags": ["--carry"], "required": False, "switch": True, "default": False,
                              "choices": None}}


def test_every_command_keeps_its_options_and_defaults():
    want = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    want = {cmd: {**opts, **ADDED.get(cmd, {})} for cmd, opts in want.items()}
    got = json.loads(json.dumps(current()))  # tuples as lists, as in the snapshot
    assert sorted(got) == sorted(want)
    for cmd in want:
        assert sorted(got[cmd]) == sorted(want[cmd]), cmd
        for flag, spec in want[cmd].items():
            assert got[cmd][flag] == {**spec, **INTENDED.get((cmd, flag), {})}, (cmd, flag)


def test_the_snapshot_covers_every_command():
    """The snapshot is not empty or partial: the commands of today and their main options."""
    want = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    assert set(want) == {"atlas", "bench", "demo", "eval", "figures", "fit", "frontier", "heads",
                         "patch effects", "patch inter", "patch intra", "run"}
    assert want["fit"]["--lr"]["default"] == 0.2 and want["fit"]["--batch-size"]["default"] == 8
    assert want["frontier"]["--seeds"]["default"] == 1 and want["heads"]["--seeds"]["default"] == 5
    assert "--lenses" not in want["frontier"] and "--budgets" not in want["heads"]


def test_frontier_selectors_default_is_the_selector_registry():
    """The --selectors default is read from the registry (which imports no tensor library): it
    lists every selector, in the registry's order."""
    from sitelens.lenses.registry import SELECTORS

    assert current()["frontier"]["--selectors"]["default"] == ",".join(SELECTORS)


@pytest.mark.parametrize("model, n", [("smollm2-135m-instruct", 30 * 9), ("gemma-3-270m", 18 * 4),
                                      ("tiny-random", 2 * 4)])
def test_frontier_budgets_meet_the_head_count_of_the_record_before_any_load(model, n, monkeypatch,
                                                                            tmp_path, capsys):
    """A budget above ``n_layers * n_heads`` of a bundled model's record (or of a tiny model's
    arguments) is refused before the model loads; the largest one passes the check."""
    import sitelens.models
    from sitelens.cli import main
    from sitelens.cli.frontier import known_head_count

    assert known_head_count(model) == n and known_head_count("some/other-model") is None
    monkeypatch.setattr(sitelens.models, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.chdir(tmp_path)
    argv = ["frontier", "--model", model, "--task", "antonym", "--out", "fr", "--budgets"]
    assert main([*argv, f"1,{n + 1}"]) == 2
    assert f"Budget {n + 1} is outside [1, {n}]" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("fixture, name", [("smollm2", "smollm2-135m-instruct"),
                                           ("gemma", "gemma-3-270m")])
def test_bundled_records_hold_the_loaded_head_counts(fixture, name, request):
    from sitelens.models import BUNDLED

    model = request.getfixturevalue(fixture)
    record = BUNDLED[name]
    assert (record.n_layers, record.n_heads) == (model.cfg.n_layers, model.cfg.n_heads)


def documented_command_lines() -> list[tuple[str, str, list[str]]]:
    """``(page, command, [--flag, ...])`` of every ``sitelens ...`` line in the bash blocks of the
    README and docs/ (continuation lines joined)."""
    import re

    root = Path(__file__).resolve().parents[1]
    out = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = line.split("#")[0].split()
                if words[:1] != ["sitelens"] or len(words) < 2:
                    continue
                cmd = " ".join(words[1:3]) if words[1] == "patch" else words[1]
                out.append((page.name, cmd, re.findall(r"(?<![\w-])--[a-z][\w-]*", line)))
    return out


def test_documented_command_lines_use_real_commands_and_options():
    """Every command and option in the README's and docs' command lines exists (values are not
    parsed: the docs use placeholders such as HEAD_IP and devices this machine may not have)."""
    parsers = leaf_parsers(build_parser())
    lines = documented_command_lines()
    assert any(cmd == "frontier" for _, cmd, _ in lines) and len(lines) >= 20
    bad = [(page, cmd, flag) for page, cmd, flags in lines for flag in flags
           if cmd not in parsers or flag not in parsers[cmd]._option_string_actions]
    assert bad == []


def test_schedule_options_reach_the_fit_config():
    """The stage-2 schedule options set the FitConfig a fit uses; untyped, today's schedule."""
    from sitelens.cli.common import fit_config_from_args
    from sitelens.site.config import FitConfig

    base = ["fit", "--model", "tiny-random", "--task", "antonym", "--out", "ad"]
    args = build_parser().parse_args([*base, "--eval-every", "25", "--n-valid", "32", "--patience", "2",
                                      "--lr-rule", "sqrt", "--batch-size", "16"])
    cfg = fit_config_from_args(args)
    assert (cfg.eval_every, cfg.n_valid, cfg.patience, cfg.lr_rule, cfg.batch_size) == (25, 32, 2, "sqrt", 16)
    assert fit_config_from_args(build_parser().parse_args(base)) == FitConfig()
    official = fit_config_from_args(build_parser().parse_args([*base, "--protocol", "official"]))
    assert (official.eval_every, official.n_valid) == (50, 100)  # the official protocol's own
