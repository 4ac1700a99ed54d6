#!/usr/bin/env bash
# Builds the English text corpus of the end-to-end GPU run (deploy/e2e-gpu.sh)
# from documentation that Debian ships, on a Debian 12 machine with apt:
#   debian-handbook      The Debian Administrator's Handbook (en-US pages),
#                        GPL-2.0+ or CC-BY-SA-3.0
#   debian-reference-en  Debian Reference (English), GPL-2.0+
#   python3.11-doc       The Python 3.11 documentation, PSF-2.0
# Writes OUT_DIR/corpus.txt.gz (default .deps/e2e; git ignores .deps) and
# the packages' copyright files beside it. One document per HTML page.
#
#   deploy/fetch-e2e-corpus.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.deps/e2e}
work=$(mktemp -d /tmp/megatrain-corpus.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
packages=(debian-handbook debian-reference-en python3.11-doc)
(cd "$work" && apt-get download "${packages[@]}" >/dev/null 2>&1) || {
  echo "apt-get download ${packages[*]} failed (run apt-get update first)" >&2; exit 1; }
for f in "$work"/*.deb; do dpkg -x "$f" "$work/x"; done
for p in "${packages[@]}"; do
  cp "$work/x/usr/share/doc/$p/copyright" "$out/$p.copyright"
done
mapfile -t pages < <(
  find "$work/x/usr/share/doc/debian-handbook/html/en-US" -name '*.html'
  find "$work/x/usr/share/debian-reference" -name '*.en.html'
  find "$work/x/usr/share/doc/python3.11/html" -name '*.html' \
    -not -path '*/_static/*' -not -name 'genindex*' -not -name 'py-modindex*' -not -name 'search.html')
python3 deploy/html-to-text.py "$work/corpus.txt" "${pages[@]}"
gzip -9 -c "$work/corpus.txt" > "$out/corpus.txt.gz"
ls -l "$out"
