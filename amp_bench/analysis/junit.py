"""The one JUnit XML writer, for compare and nightly: CI servers (GitLab, Jenkins, GitHub test
reporters) show a failed case by name. The document is built with the standard library's
ElementTree, which does the escaping; this module only fixes the shape both gates share: a
`<testsuites>` root with totals, one `<testsuite>` per group, one `<testcase>` per judged item, a
finding as `<failure>` and a neutral or undecided item as `<skipped>`."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass(frozen=True)
class TestCase:
    classname: str
    name: str
    failure: str | None = None  # the message of a finding; the case fails
    failure_type: str = ""      # the verdict word, the failure element's text
    skipped: str | None = None  # the reason a case was not judged


def to_junit(name: str, suites: list[tuple[str, list[TestCase]]]) -> str:
    """`suites`: (suite name, its cases) in display order."""
    root = ET.Element("testsuites", name=name)
    total = failed = skipped = 0
    for suite_name, cases in suites:
        suite_failed = sum(c.failure is not None for c in cases)
        suite_skipped = sum(c.failure is None and c.skipped is not None for c in cases)
        suite = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(cases)),
                              failures=str(suite_failed), skipped=str(suite_skipped))
        for case in cases:
            element = ET.SubElement(suite, "testcase", classname=case.classname, name=case.name)
            if case.failure is not None:
                ET.SubElement(element, "failure", message=case.failure).text = case.failure_type
            elif case.skipped is not None:
                ET.SubElement(element, "skipped", message=case.skipped)
        total, failed, skipped = total + len(cases), failed + suite_failed, skipped + suite_skipped
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("skipped", str(skipped))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
