"""Exit 1 unless every test that passed on the reference (junit XML argv[1]) also passed with
instanttensor in its place (argv[2]); prints both counts."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree


def outcomes(path: str) -> dict[str, str]:
    result = {}
    for case in ElementTree.parse(path).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[name] = ("failed" if kinds & {"failure", "error"} else
                        "skipped" if "skipped" in kinds else "passed")
    return result


def main() -> None:
    reference, ours = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    lost = sorted(n for n, o in reference.items() if o == "passed" and ours.get(n) != "passed")
    for label, runs in (("reference", reference), ("instanttensor", ours)):
        counts = {k: sum(1 for o in runs.values() if o == k) for k in ("passed", "skipped", "failed")}
        print(f"{label}: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped")
    if lost:
        print("passed on the reference, not with instanttensor:\n  " + "\n  ".join(lost))
        sys.exit(1)


if __name__ == "__main__":
    main()
