"""megatrain_client.chat_template against transformers: every conversation
of tests/testdata/tokenizers/*/expected.json (rendered there by
transformers' apply_chat_template) must render to the same text, and the
generation spans must equal tests/testdata/tokenizers/chat_spans.json,
which the C++ side (text_corpus_test: ChatFormatGivesTransformersIdsAndMasks)
turns into ids and masks compared with transformers' own.

    python3 tests/python/chat_template_test.py [--write]   (from the source root)
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from megatrain_client import chat_template  # noqa: E402

ROOT = "tests/testdata/tokenizers"
SPANS = os.path.join(ROOT, "chat_spans.json")


def main():
    spans = {}
    checked = 0
    for name in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, name)
        if not os.path.isdir(d):
            continue
        with open(os.path.join(d, "expected.json"), encoding="utf-8") as f:
            chats = json.load(f)["chats"]
        if not chats:
            continue
        source, variables = chat_template.load_model_template(d)
        template = chat_template.compile_template(source)
        spans[name] = []
        for i, chat in enumerate(chats):
            assert "error" not in chat, f"{name}[{i}]: fixture records an error"
            text, char_spans = chat_template.render(template, chat["messages"], variables)
            assert text == chat["rendered"], f"{name}[{i}]: rendered\n{text!r}\n!=\n{chat['rendered']!r}"
            spans[name].append(chat_template.char_spans_to_bytes(text, char_spans))
            checked += 1
    if "--write" in sys.argv:
        with open(SPANS, "w") as f:
            json.dump(spans, f, indent=1)
    with open(SPANS) as f:
        assert json.load(f) == spans, f"{SPANS} is stale: run with --write"
    assert checked >= 12, checked
    print(f"chat_template: {checked} conversations render exactly as transformers")


if __name__ == "__main__":
    main()
