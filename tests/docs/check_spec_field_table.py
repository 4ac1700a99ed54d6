#!/usr/bin/env python3
"""Keeps Note [Spec field table] (engine/spec/spec_fields.h) honest.

For every row of the tables (a number or keyword field of train.*,
optimizer.*, eval.*, checkpoint.* or memory.*) checks that none of the
table's consumers also spells the field out by hand, so that a row stays
the one place the field is declared for them, and that docs/job-spec.md
lists the field:

  engine/spec/job_spec.cc       no "section.name" literal (a check by hand)
  engine/spec/job_spec_json.cc  no "name" key
  server/rpc/proto_convert.cc   no section...name() / section...set_name()
                                (a rule may still ask has_name())
  client/job_file.cc            no "name" YAML key
  docs/job-spec.md              a `section.name` row

Usage: check_spec_field_table.py <source root>; exit status 1 with one
line per problem.
"""
import pathlib
import re
import sys

TABLE = re.compile(r"#define MEGATRAIN_([A-Z]+)_(?:NUMBER|KEYWORD)_FIELDS\(X\)"
                   r"((?:.*\\\n)*.*\n)")


def rows(header):
    """(section, name) of every row, from the #define of each table."""
    out = []
    for match in TABLE.finditer(header):
        section = match.group(1).lower()
        for name in re.findall(r"X\((\w+),", match.group(2)):
            out.append((section, name))
    return out


def main():
    root = pathlib.Path(sys.argv[1])
    read = lambda path: (root / path).read_text()
    table = rows(read("engine/spec/spec_fields.h"))
    if not table:
        sys.exit("spec_fields.h: the tables have no rows")
    checks = [
        ("engine/spec/job_spec.cc", lambda s, n: rf'"{s}\.{n}"'),
        ("engine/spec/job_spec_json.cc", lambda s, n: rf'"{n}"'),
        ("server/rpc/proto_convert.cc",
         lambda s, n: rf"(?<![\w]){s}(\(\))?(\.|->)(set_)?{n}\("),
        ("client/job_file.cc", lambda s, n: rf'"{n}"'),
    ]
    problems = []
    for path, pattern in checks:
        text = read(path)
        for section, name in table:
            if re.search(pattern(section, name), text):
                problems.append(f"{path}: spells out {section}.{name} by hand; "
                                "it is a row of engine/spec/spec_fields.h")
    docs = read("docs/job-spec.md")
    for section, name in table:
        if f"`{section}.{name}`" not in docs:
            problems.append(f"docs/job-spec.md: no row for `{section}.{name}`")
    for problem in problems:
        print(problem)
    print(f"{len(table)} fields checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
