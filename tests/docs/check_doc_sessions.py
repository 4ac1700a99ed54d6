#!/usr/bin/env python3
"""No document or source comment names a development session ("session
12", "Session 9's").

Documents describe the product as it is; when something was measured or
changed is a date (docs/performance-history.md, docs/CHANGELOG.md). Scans
README.md, every *.md under docs/, deploy/, examples/ and tests/ (as
check_doc_paths.py does), and the sources and scripts under engine/,
server/, client/, proto/, deploy/ and tests/ (their comments cite the
history by date too). This script is skipped: it names the pattern.

Usage: check_doc_sessions.py REPO_ROOT   (exit 0: none; 1: lists them)
"""
import os
import re
import sys

SESSION = re.compile(r"\bsessions?[\s-]+\d+", re.IGNORECASE)


SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".proto", ".py", ".sh", ".cmake", ".txt", ".yaml")


def documents(root):
    yield os.path.join(root, "README.md")
    yield os.path.join(root, "CMakeLists.txt")
    for top in ("docs", "deploy", "examples", "tests"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("testdata",)]
            for name in sorted(filenames):
                if name.endswith(".md"):
                    yield os.path.join(dirpath, name)
    this = os.path.abspath(__file__)
    for top in ("engine", "server", "client", "proto", "deploy", "tests"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("testdata", "__pycache__")]
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if name.endswith(SOURCE_SUFFIXES) and os.path.abspath(path) != this:
                    yield path


def main():
    root = os.path.abspath(sys.argv[1])
    found = []
    for doc in documents(root):
        if not os.path.exists(doc):
            continue
        with open(doc, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for match in SESSION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{os.path.relpath(doc, root)}:{line}: '{match.group(0)}'")
    if found:
        print("documents name development sessions (use a date instead):")
        print("\n".join(found))
        return 1
    print("no document names a development session")
    return 0


if __name__ == "__main__":
    sys.exit(main())
