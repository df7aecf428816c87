"""Summarizes the JUnit XML of the E2B upstream measurement
(scripts/e2b-upstream.sh): pass / fail / skipped per suite, the tests the
exclusion list sets apart (needing E2B's cloud or the public internet), and
every failure with its first line. Test harness only."""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def load_exclusions(path: Path, suite: str):
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, _, reason = line.partition("|")
        s, _, pattern = head.strip().partition(" ")
        if s == suite:
            rules.append((pattern.strip(), reason.strip()))
    return rules


def cases(xml_paths):
    for p in xml_paths:
        if not Path(p).exists():  # a part the run left out
            continue
        seen = {}
        for tc in ET.parse(p).getroot().iter("testcase"):
            tid = f"{tc.get('classname')}::{tc.get('name')}"
            # Tests may share a name (vitest reports parametrized cases so);
            # number the repeats, in file order, so each counts once.
            seen[tid] = seen.get(tid, 0) + 1
            if seen[tid] > 1:
                tid += f" #{seen[tid]}"
            failure = tc.find("failure")
            if failure is None:
                failure = tc.find("error")
            if failure is not None:
                msg = (failure.get("message") or failure.text or "").strip().splitlines()
                yield tid, "fail", (msg[0][:200] if msg else "")
            elif tc.find("skipped") is not None:
                yield tid, "skip", ""
            else:
                yield tid, "pass", ""


def main() -> None:
    suite, excl, *xmls = sys.argv[1:]
    rules = load_exclusions(Path(excl), suite)
    results = {}
    for tid, status, msg in cases(xmls):
        # A later file (a re-run) wins, but for the tests it filtered out.
        if status != "skip" or tid not in results:
            results[tid] = (status, msg)
    counted = {"pass": 0, "fail": 0, "skip": 0}
    excluded = []
    failures = []
    for tid, (status, msg) in sorted(results.items()):
        reason = next((r for pat, r in rules if pat in tid), None)
        if reason:
            excluded.append((tid, status, reason))
            continue
        counted[status] += 1
        if status == "fail":
            failures.append((tid, msg))
    ran = counted["pass"] + counted["fail"]
    pct = 100.0 * counted["pass"] / ran if ran else 0.0
    print(f"{suite}: {len(results)} tests: {counted['pass']} pass, {counted['fail']} fail, "
          f"{counted['skip']} skipped, {len(excluded)} excluded; pass rate {pct:.1f}% of {ran}")
    for tid, status, reason in excluded:
        print(f"  excluded ({status}) {tid}: {reason}")
    for tid, msg in failures:
        print(f"  FAIL {tid}: {msg}")


if __name__ == "__main__":
    main()
