#!/usr/bin/env python3
"""Checks that every relative link in the repository's Markdown documents points to a file or folder
that exists: README.md, CONTRIBUTING.md, docs/ and the hand-written Markdown under evidence/ (README.md and
notes/ of each GPU; the reports `fusekit report` writes hold no links of their own).

Usage: markdown_links_test.py REPOSITORY_ROOT. Exits 1 and names each broken link otherwise.
"""
import pathlib
import re
import sys

# [text](target) with the target up to the first space or closing parenthesis; images too.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)")


def documents(root):
    for name in ("README.md", "CONTRIBUTING.md"):
        if (root / name).exists():
            yield root / name
    yield from sorted((root / "docs").glob("*.md"))
    for gpu in sorted((root / "evidence").glob("*/")):
        if (gpu / "README.md").exists():
            yield gpu / "README.md"
        yield from sorted((gpu / "notes").glob("*.md"))


def broken_links(document):
    text = document.read_text(encoding="utf-8")
    for line_number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same document
            path = target.split("#", 1)[0]
            if not (document.parent / path).exists():
                yield line_number, target


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    checked = 0
    failures = []
    for document in documents(root):
        checked += 1
        for line_number, target in broken_links(document):
            failures.append(f"{document.relative_to(root)}:{line_number}: no such file: {target}")
    for failure in failures:
        print(failure)
    print(f"{checked} documents checked, {len(failures)} broken links")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
