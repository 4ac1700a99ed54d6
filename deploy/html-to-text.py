#!/usr/bin/env python3
"""Turns HTML documentation pages into the plain-text corpus format of
`megatrain tokenize` (docs/data-format.md): one document per page, documents
separated by a blank line, paragraphs of a page on their own lines.

  python3 deploy/html-to-text.py OUT.txt PAGE.html...

Scripts, styles and navigation boilerplate (header/footer/nav elements) are
dropped; whitespace is collapsed. Used by deploy/fetch-e2e-corpus.sh.
"""
import html.parser
import re
import sys

BLOCK = {"p", "div", "li", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd",
         "tr", "br", "table", "section", "blockquote", "title"}
SKIP = {"script", "style", "nav", "header", "footer", "head"}


class PageText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.skip = 0
        self.lines = []
        self.current = []

    def flush(self):
        line = re.sub(r"\s+", " ", "".join(self.current)).strip()
        if line:
            self.lines.append(line)
        self.current = []

    def handle_starttag(self, tag, attrs):
        if tag in SKIP:
            self.skip += 1
        elif tag in BLOCK:
            self.flush()

    def handle_endtag(self, tag):
        if tag in SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in BLOCK:
            self.flush()

    def handle_data(self, data):
        if not self.skip:
            self.current.append(data)


def main():
    out_path, pages = sys.argv[1], sys.argv[2:]
    docs = 0
    chars = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for page in sorted(pages):
            parser = PageText()
            with open(page, encoding="utf-8", errors="replace") as f:
                parser.feed(f.read())
            parser.close()
            parser.flush()
            # Pages of a few lines are navigation stubs, not text.
            lines = [l for l in parser.lines if len(l) > 1]
            if sum(len(l) for l in lines) < 500:
                continue
            text = "\n".join(lines)
            out.write(text + "\n\n")
            docs += 1
            chars += len(text)
    print(f"{out_path}: {docs} documents, {chars / 1e6:.1f} M characters")


if __name__ == "__main__":
    main()
