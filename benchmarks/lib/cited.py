"""Numbers this repository did not measure (from papers, or from runs no command here repeats), read
from ``benchmarks/cited.csv``: one row per number with its value, unit, source, model and setting.
A report shows such a number as cited, with its source, and never as a column of its results;
``docs/claims.toml`` reads the same file for the pages that quote them."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

CITED = Path(__file__).resolve().parents[1] / "cited.csv"


@dataclass(frozen=True)
class Cited:
    id: str
    value: float
    unit: str
    source: str
    model: str
    setting: str

    def describe(self, fmt: str = "g") -> str:
        """``VALUE UNIT (SOURCE; MODEL; SETTING)``, the way a report shows a cited number."""
        v = format(self.value, fmt)
        unit = "" if self.unit == "fraction" or fmt.endswith("%") else f" {self.unit}".replace(" %", "%")
        return f"{v}{unit} (cited: {self.source}; {self.model}; {self.setting})"


def load(path: Path = CITED) -> dict[str, Cited]:
    """Every cited number by its id."""
    with open(path, newline="", encoding="utf-8") as f:
        return {r["id"]: Cited(r["id"], float(r["value"]), r["unit"], r["source"], r["model"], r["setting"])
                for r in csv.DictReader(f)}


def cited(key: str, path: Path = CITED) -> Cited:
    """One cited number; a ``KeyError`` names the missing id."""
    table = load(path)
    if key not in table:
        raise KeyError(f"no cited number {key!r} in {path}")
    return table[key]
