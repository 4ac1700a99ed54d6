#!/usr/bin/env bash
# Checks that every C++ source in the repository is formatted by the
# repository's .clang-format (Google style, 100 columns). Exit 0 when all
# are; otherwise lists the files and exits 1. Run by ctest (test
# source_format) and so by deploy/run-tests.sh.
#
#   deploy/check-format.sh           # check
#   deploy/check-format.sh --fix     # rewrite the files in place
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format="${CLANG_FORMAT:-clang-format}"
command -v "$clang_format" >/dev/null || {
  echo "check-format: $clang_format not found (deploy/install-deps.sh installs it)" >&2
  exit 1
}
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^tests/testdata/')
else
  mapfile -t files < <(find engine server client tests -name '*.cc' -o -name '*.h' | grep -v '^tests/testdata/')
fi
if [ "${1:-}" = "--fix" ]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$clang_format" --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ "${#bad[@]}" -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from .clang-format (fix: deploy/check-format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
