"""No test may be skipped by every CI job: each test one job skips must pass in another.

The two CI jobs skip complementary tests under ``CI=1`` (tests/conftest.py lets a skip stand only
when the test needs a GPU or a backend the job lacks): the main job (TransformerLens 4, the
TransformerBridge) skips what needs ``HookedTransformer``, the 3.9 job (``SITELENS_BACKEND=hooked``)
what needs the bridge. This script reads the jobs' JUnit XML files (pytest ``--junitxml``) and
fails, listing them, when a test skipped in one job passed in none: skipped there too, or never
collected. A test parametrized by the backends a job runs counts as run when its case on the other
backend passed. A test that needs a GPU (no CI job has one) and a known upstream failure that the
test names as such are the allowed exceptions.

Usage: ``python scripts/ci_skips.py MAIN.xml TL39.xml`` (exit 1 and the list when some test ran
nowhere; each job's skip count printed).
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

# skips no job can lift: no CI job has a GPU; an upstream bug the test names as a known failure;
# a machine without the offline mirror of the public reference code (tests/test_reference_bench.py)
ALLOWED = re.compile(r"\bGPUs?\b|\bCUDA\b|known failure|offline mirror of .* is absent")
BACKEND = re.compile(r"^(hooked|bridge)$")


def function_of(key: str) -> str:
    """A test id without its backend parameter (``test_x[bridge-24]`` -> ``test_x[24]``): a test
    parametrized by the backends a job runs counts as run when its other backend's case ran."""
    head, sep, params = key.partition("[")
    if not sep:
        return key
    kept = [p for p in params.rstrip("]").split("-") if not BACKEND.match(p)]
    return f"{head}[{'-'.join(kept)}]" if kept else head


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
    """The tests some job skipped and no job passed, with each job's outcome; GPU skips and known
    failures left out. A module skipped whole at collection (JUnit: the module as the name, no
class) counts as run
    where another job passed a test of that module; a test as run where another case of it that
    differs only in the backend passed."""
    passed = {function_of(k) for job in jobs.values() for k, (o, _) in job.items() if o == "passed"}
    modules = {k.split("::", 1)[0] for job in jobs.values() for k, (o, _) in job.items() if o == "passed"}
    bad = []
    for key in sorted({k for job in jobs.values() for k, (o, _) in job.items() if o == "skipped"}):
        seen = {name: job.get(key, ("not collected", "")) for name, job in jobs.items()}
        module, _, name = key.partition("::")
        if function_of(key) in passed or (not module and name in modules):
            continue
        if any(o == "skipped" and ALLOWED.search(why) for o, why in seen.values()):
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
