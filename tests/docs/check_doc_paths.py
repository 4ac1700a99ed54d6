#!/usr/bin/env python3
"""Every repository path a document names must exist (issue 20).

Scans README.md and every *.md under docs/, deploy/, examples/ and tests/
for paths into the repository: `code spans` and [link](targets) that start
with a top-level directory (engine/, server/, client/, proto/, tests/, docs/,
deploy/, examples/, cmake/) or name a top-level file, and relative links
resolved against the document's directory. Globs (*), placeholders (<x>,
{x}, ...), URLs and anchors are skipped; a trailing `:line` or `#anchor` is
dropped. A path outside the repository (`../shared/...`) is an error: a
user's clone has no such file.

Usage: check_doc_paths.py REPO_ROOT   (exit 0: all found; 1: lists the rest)
"""
import os
import re
import sys

TOP_DIRS = ("engine/", "server/", "client/", "proto/", "tests/", "docs/", "deploy/",
            "examples/", "cmake/")
TOP_FILES = ("README.md", "CMakeLists.txt", ".clang-format", ".gitignore")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def documents(root):
    yield os.path.join(root, "README.md")
    for top in ("docs", "deploy", "examples", "tests"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d not in ("testdata",)]
            for name in sorted(filenames):
                if name.endswith(".md"):
                    yield os.path.join(dirpath, name)


def clean(token):
    token = token.strip().strip("'\"")
    token = re.split(r"[#?]", token, maxsplit=1)[0]
    token = re.sub(r"(:\d+(-\d+)?)+$", "", token)  # file.cc:123
    return token.rstrip(".,;:)")


def skip(token):
    return (not token or any(c in token for c in "*<>{}$ |=") or "..." in token
            or token.startswith(("http://", "https://", "mailto:", "/", "~")))


# Paths in running text: a top-level directory or ../ prefix and a file
# name with an extension, or a top-level file name on its own.
PLAIN = re.compile(r"(?<![\w/.$-])((?:\.\./)+[\w./-]+\.\w+|(?:" +
                   "|".join(d.rstrip("/") for d in TOP_DIRS) + r")/[\w./-]+\.\w+|" +
                   "|".join(re.escape(f) for f in TOP_FILES if "." in f[1:]) + r")(?![\w/])")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def candidates(text):
    for match in CODE_SPAN.finditer(text):
        for word in match.group(1).split():
            yield word, False
    for match in LINK.finditer(text):
        yield match.group(1), True
    prose = CODE_SPAN.sub(" ", FENCE.sub(" ", text))
    for match in PLAIN.finditer(prose):
        yield match.group(1), False


def main():
    root = os.path.abspath(sys.argv[1])
    missing = []
    for doc in documents(root):
        if not os.path.exists(doc):
            continue
        text = open(doc, encoding="utf-8").read()
        rel_doc = os.path.relpath(doc, root)
        for raw, is_link in candidates(text):
            token = clean(raw)
            if skip(token):
                continue
            if token.startswith("../") and not is_link:
                if not re.search(r"\.\w+$", token):
                    continue  # `../lib`: relative to an installed binary, not a file here
                path = os.path.normpath(os.path.join(os.path.dirname(doc), token))
            elif is_link:
                path = os.path.normpath(os.path.join(os.path.dirname(doc), token))
            elif token.startswith(TOP_DIRS) or token in TOP_FILES:
                path = os.path.join(root, token)
            else:
                continue
            if not (path == root or path.startswith(root + os.sep)):
                missing.append(f"{rel_doc}: '{raw}' is outside the repository")
            elif not os.path.exists(path):
                missing.append(f"{rel_doc}: '{raw}' does not exist")
    for line in sorted(set(missing)):
        print(line)
    if missing:
        print(f"FAIL: {len(set(missing))} path(s) named by documents are missing")
        return 1
    print("every repository path named by a document exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
