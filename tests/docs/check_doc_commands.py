#!/usr/bin/env python3
"""Every flag that README.md and docs/*.md give the project's programs exists.

Reads the code blocks (fenced, or indented by four spaces) of README.md and
docs/*.md and the inline code spans that start with a program's name,
joins lines continued with a backslash, and takes each command
line that runs one of the project's programs (megatrain and its
subcommands, megatraind, megatrain-bench, megatrain-tokenize,
megatrain-logits, megatrain-nvme-bench, megatrain-loadtest, by name or by a
path to it). Each `--flag` of such a line must appear in that program's
`--help` (for megatrain: the subcommand's help or the global options).

  check_doc_commands.py REPO BUILD_DIR

Prints each unknown flag with its file and line, and exits 1 when there is
one; 0 otherwise. What the flags do is the other tests' business: this
keeps the documented commands from naming flags that are gone or renamed.
"""

import os
import re
import subprocess
import sys

PROGRAMS = {
    "megatrain": "client/megatrain",
    "megatraind": "server/megatraind",
    "megatrain-bench": "engine/megatrain-bench",
    "megatrain-tokenize": "engine/megatrain-tokenize",
    "megatrain-logits": "engine/megatrain-logits",
    "megatrain-nvme-bench": "engine/megatrain-nvme-bench",
    "megatrain-loadtest": "client/megatrain-loadtest",
}
FLAG = re.compile(r"^--([A-Za-z0-9_][A-Za-z0-9_-]*)")


def code_lines(path):
    """(line number, text) of every line in a code block of `path`, and of
    every inline code span of prose that starts with a program's name."""
    out, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fenced = not fenced
                continue
            if fenced or (line.startswith("    ") and stripped):
                out.append((number, line.rstrip("\n")))
                continue
            for span in re.findall(r"`([^`]+)`", line):
                if span.split() and program_of(span.split()[0]):
                    out.append((number, span))
    return out


def commands(lines):
    """Joins continued lines: (first line number, command text)."""
    joined, start, parts = [], None, []
    for number, text in lines:
        if start is None:
            start = number
        parts.append(text.rstrip("\\").strip())
        if not text.rstrip().endswith("\\"):
            joined.append((start, " ".join(parts)))
            start, parts = None, []
    if parts:
        joined.append((start, " ".join(parts)))
    return joined


def program_of(token):
    name = os.path.basename(token)
    return name if name in PROGRAMS else None


class Helps:
    """Each program's (and megatrain subcommand's) --help text, cached."""

    def __init__(self, build):
        self.build, self.cache = build, {}

    def subcommands(self):
        """megatrain's subcommand names (its help's "Subcommands:" list)."""
        text = self.text("megatrain")
        listed = text[text.find("Subcommands:"):] if "Subcommands:" in text else ""
        return set(re.findall(r"^  ([a-z][a-z-]*) ", listed, re.MULTILINE)) | {"tokenize"}

    def text(self, program, sub=None):
        key = (program, sub)
        if key not in self.cache:
            args = [os.path.join(self.build, PROGRAMS[program])]
            if sub:
                args.append(sub)
            result = subprocess.run(args + ["--help"], capture_output=True, text=True,
                                    timeout=60, check=False)
            self.cache[key] = result.stdout + result.stderr
        return self.cache[key]


def unknown_flags(command, helps):
    """The flags of `command` (a shell line) its program's help lacks."""
    tokens = command.replace(";", " ; ").replace("|", " | ").replace("&&", " && ").split()
    missing = []
    i = 0
    while i < len(tokens):
        program = program_of(tokens[i].lstrip("$"))
        if program is None:
            i += 1
            continue
        args = []
        i += 1
        while i < len(tokens) and tokens[i] not in (";", "|", "&&", ">", "2>", "<"):
            args.append(tokens[i])
            i += 1
        sub = None
        if program == "megatrain":
            sub = next((a for a in args if a in helps.subcommands()), None)
        helps_text = helps.text(program) + (helps.text(program, sub) if sub else "")
        for arg in args:
            m = FLAG.match(arg)
            if m and not re.search(r"--" + re.escape(m.group(1)) + r"\b", helps_text):
                missing.append(f"{program}{' ' + sub if sub else ''} --{m.group(1)}")
    return missing


def main():
    repo, build = sys.argv[1], sys.argv[2]
    helps = Helps(build)
    docs = [os.path.join(repo, "README.md")] + sorted(
        os.path.join(repo, "docs", f) for f in os.listdir(os.path.join(repo, "docs"))
        if f.endswith(".md"))
    bad = 0
    checked = 0
    for path in docs:
        for number, command in commands(code_lines(path)):
            flags = unknown_flags(command, helps)
            if any(program_of(t.lstrip("$")) for t in command.split()):
                checked += 1
            for flag in flags:
                print(f"{os.path.relpath(path, repo)}:{number}: {flag} is not in its --help")
                bad += 1
    print(f"{checked} documented commands checked, {bad} unknown flag(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
