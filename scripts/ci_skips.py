"""No test may be skipped by every CI job: each test one job skips must pass in another.

The two CI jobs skip complementary tests under ``CI=1`` (tests/conftest.py lets a skip stand only
when the test needs a GPU or a backend the job lacks): the main job (TransformerLens 4, the
TransformerBridge) skips what needs ``HookedTransformer``, the 3.9 job (``SITELENS_BACKEND=hooked``)
what needs the bridge. This script reads the jobs' JUnit XML files (pytest ``--junitxml``) and
fails, listing them, when a test skipped in one job passed in none: skipped there too, or never
collected (a test parametrized by the backends a job runs exists only in that job). A test that
needs a GPU is the one allowed exception (no CI job has one).

Usage: ``python scripts/ci_skips.py MAIN.xml TL39.xml`` (exit 1 and the list when some test ran
nowhere; each job's skip count printed).
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

GPU = re.compile(r"\bGPUs?\b|\bCUDA\b")


def outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """``{test id: (outcome, skip message)}`` of one JUnit file; outcome ``passed``, ``skipped`` or
    ``failed`` (a failure or error in any phase wins over the others)."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag: child for child in case}
        if "failure" in tags or "error" in tags:
            got = ("failed", "")
        elif "skipped" in tags:
            skip = tags["skipped"]
            got = ("skipped", skip.get("message") or skip.text or "")
        else:
            got = ("passed", "")
        if out.get(key, ("",))[0] != "failed":
            out[key] = got
    return out


def skipped_everywhere(jobs: dict[str, dict[str, tuple[str, str]]]) -> list[str]:
    """The tests some job skipped and no job passed, with each job's outcome; GPU skips left out."""
    bad = []
    for key in sorted({k for job in jobs.values() for k, (o, _) in job.items() if o == "skipped"}):
        seen = {name: job.get(key, ("not collected", "")) for name, job in jobs.items()}
        if any(o == "passed" for o, _ in seen.values()):
            continue
        if any(o == "skipped" and GPU.search(why) for o, why in seen.values()):
            continue
        bad.append(f"{key}: " + "; ".join(f"{name} {o}" + (f" ({why})" if why else "")
                                          for name, (o, why) in seen.items()))
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", nargs="+", type=Path, help="one JUnit XML file per CI job")
    args = ap.parse_args(argv)
    jobs = {p.stem: outcomes(p) for p in args.junit}
    for name, job in jobs.items():
        n = sum(o == "skipped" for o, _ in job.values())
        print(f"ci_skips: {name}: {len(job)} tests, {n} skipped")
    bad = skipped_everywhere(jobs)
    if bad:
        print(f"ci_skips: {len(bad)} tests skipped in one job and passed in none:", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        return 1
    print("ci_skips: every test a job skipped passed in another")
    return 0


if __name__ == "__main__":
    sys.exit(main())
