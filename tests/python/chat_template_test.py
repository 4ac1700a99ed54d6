"""megatrain_client.chat_template against transformers.

- Every conversation of tests/testdata/tokenizers/*/expected.json (rendered
  there by transformers' apply_chat_template) must render to the same text,
  and the {% generation %} spans must equal
  tests/testdata/tokenizers/chat_spans.json, which the C++ side
  (text_corpus_test: ChatFormatGivesTransformersIdsAndMasks) turns into ids
  and masks compared with transformers' own.
- The prefix-render spans (Note [Assistant spans]) must equal the generation
  spans on every one of those templates.
- The released templates of tests/testdata/chat/ (no generation blocks;
  tests/testdata/make_chat_fixtures.py) must render the same text with the
  same spans from OpenAI and ShareGPT input; their output is kept in
  tests/testdata/chat/<name>.rendered.jsonl (and .shortened.jsonl, one
  conversation without its oldest exchange) for text_corpus_test
  (ReleasedTemplatesGiveTransformersMasks,
  LongConversationsDropTheirOldestTurnsOrAreDropped).

    python3 tests/python/chat_template_test.py [--write]   (from the source root)
"""
import argparse
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from megatrain_client import chat_template  # noqa: E402

ROOT = "tests/testdata/tokenizers"
SPANS = os.path.join(ROOT, "chat_spans.json")
CHAT = "tests/testdata/chat"
RELEASED = {"llama3-released": "llama3-bpe", "qwen2-chatml-released": "qwen2-bpe"}
WRITE = "--write" in sys.argv


def fixture_chats():
    """{name: (template, variables, chats)} of the fixtures with chats."""
    out = {}
    for name in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, name)
        if not os.path.isdir(d):
            continue
        with open(os.path.join(d, "expected.json"), encoding="utf-8") as f:
            chats = json.load(f)["chats"]
        if chats:
            source, variables = chat_template.load_model_template(d)
            out[name] = (chat_template.compile_template(source), variables, chats, source)
    return out


def convert(model, input_path, **flags):
    """Runs chat_template.convert; (records, counts, log)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.jsonl")
        args = argparse.Namespace(model=model, input=input_path, output=out,
                                  assistant_mask=flags.get("assistant_mask", "auto"),
                                  keep_unanswered=flags.get("keep_unanswered", False))
        log = io.StringIO()
        counts = chat_template.convert(args, log=log)
        with open(out, encoding="utf-8") as f:
            return [json.loads(line) for line in f], counts, log.getvalue()


def write_lines(path, objects):
    with open(path, "w", encoding="utf-8") as f:
        for o in objects:
            f.write(json.dumps(o, ensure_ascii=False) + "\n")


class GenerationBlocksTest(unittest.TestCase):
    def test_renders_as_transformers_and_spans_match_golden(self):
        spans = {}
        checked = 0
        for name, (template, variables, chats, _) in fixture_chats().items():
            spans[name] = []
            for i, chat in enumerate(chats):
                self.assertNotIn("error", chat, f"{name}[{i}]: fixture records an error")
                text, char_spans = chat_template.render(template, chat["messages"], variables)
                self.assertEqual(text, chat["rendered"], f"{name}[{i}]")
                spans[name].append(chat_template.char_spans_to_bytes(text, char_spans))
                checked += 1
        if WRITE:
            with open(SPANS, "w") as f:
                json.dump(spans, f, indent=1)
        with open(SPANS) as f:
            self.assertEqual(json.load(f), spans, f"{SPANS} is stale: run with --write")
        self.assertEqual(checked, 12)

    def test_prefix_spans_equal_generation_spans(self):
        checked = 0
        for name, (template, variables, chats, source) in fixture_chats().items():
            self.assertTrue(chat_template.has_generation_blocks(source), name)
            for i, chat in enumerate(chats):
                text, generation, _ = chat_template.render_conversation(
                    template, chat["messages"], variables, "generation")
                _, prefixes, turns = chat_template.render_conversation(
                    template, chat["messages"], variables, "prefixes")
                self.assertTrue(generation, f"{name}[{i}]")
                self.assertEqual(prefixes, generation, f"{name}[{i}]: {text!r}")
                self.assertEqual([role for role, _, _ in turns],
                                 [m["role"] for m in chat["messages"]])
                checked += 1
        self.assertEqual(checked, 12)


class ReleasedTemplatesTest(unittest.TestCase):
    def test_released_templates_have_no_generation_blocks_and_mask_the_answers(self):
        with open(SPANS) as f:
            golden_spans = json.load(f)
        for name, sibling in RELEASED.items():
            model = os.path.join(CHAT, name)
            source, _ = chat_template.load_model_template(model)
            self.assertFalse(chat_template.has_generation_blocks(source), name)
            records, counts, log = convert(model, os.path.join(CHAT, "openai.jsonl"))
            self.assertIn("prefix renders", log)
            self.assertEqual(counts, {"rendered": 3, "refused": 0, "no_answer": 0})
            with open(os.path.join(ROOT, sibling, "expected.json"), encoding="utf-8") as f:
                chats = json.load(f)["chats"]
            self.assertEqual([r["text"] for r in records], [c["rendered"] for c in chats])
            self.assertEqual([r["assistant_spans"] for r in records], golden_spans[sibling])
            rendered = os.path.join(CHAT, f"{name}.rendered.jsonl")
            if WRITE:
                write_lines(rendered, records)
            with open(rendered, encoding="utf-8") as f:
                self.assertEqual([json.loads(line) for line in f], records,
                                 f"{rendered} is stale: run with --write")

    def test_shortened_conversation_golden_for_chat_truncation(self):
        # text_corpus_test LongConversationsDropTheirOldestTurnsOrAreDropped:
        # conversation 1 without its first user/assistant exchange, as the
        # template renders it (what dropping whole turns must give).
        with open(os.path.join(CHAT, "openai.jsonl"), encoding="utf-8") as f:
            messages = [json.loads(line)["messages"] for line in f][1]
        self.assertEqual([m["role"] for m in messages],
                         ["system", "user", "assistant", "user", "assistant"])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "in.jsonl")
            write_lines(path, [{"messages": messages[:1] + messages[3:]}])
            for name in RELEASED:
                records, _, _ = convert(os.path.join(CHAT, name), path)
                shortened = os.path.join(CHAT, f"{name}.shortened.jsonl")
                if WRITE:
                    write_lines(shortened, records)
                with open(shortened, encoding="utf-8") as f:
                    self.assertEqual([json.loads(line) for line in f], records,
                                     f"{shortened} is stale: run with --write")

    def test_sharegpt_input_gives_the_openai_output(self):
        model = os.path.join(CHAT, "llama3-released")
        openai, _, _ = convert(model, os.path.join(CHAT, "openai.jsonl"))
        sharegpt, _, _ = convert(model, os.path.join(CHAT, "sharegpt.jsonl"))
        self.assertEqual(sharegpt, openai)

    def test_turns_tile_the_text_in_message_order(self):
        records, _, _ = convert(os.path.join(CHAT, "qwen2-chatml-released"),
                                os.path.join(CHAT, "openai.jsonl"))
        for record in records:
            turns = record["turns"]
            self.assertEqual(turns[0]["start"], 0)
            self.assertEqual(turns[-1]["end"], len(record["text"].encode("utf-8")))
            for a, b in zip(turns, turns[1:]):
                self.assertEqual(a["end"], b["start"])
            for start, end in record["assistant_spans"]:
                self.assertTrue(any(t["role"] == "assistant" and t["start"] <= start < end <= t["end"]
                                    for t in turns), record)

    def test_generation_mode_on_a_template_without_blocks_is_refused(self):
        with self.assertRaisesRegex(chat_template.ChatDataError, "no {% generation %} blocks"):
            convert(os.path.join(CHAT, "llama3-released"), os.path.join(CHAT, "openai.jsonl"),
                    assistant_mask="generation")


class InputErrorsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.model = os.path.join(CHAT, "llama3-released")

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, objects):
        path = os.path.join(self.tmp.name, name)
        write_lines(path, objects)
        return path

    def test_text_corpus_line_names_the_line_and_the_fix(self):
        path = self.write("in.jsonl", [{"messages": [{"role": "user", "content": "a"}]},
                                       {"text": "plain"}])
        with self.assertRaisesRegex(chat_template.ChatDataError,
                                    r"in\.jsonl:2: .*ShareGPT.*--format jsonl"):
            convert(self.model, path)

    def test_unknown_sharegpt_speaker_names_the_turn(self):
        path = self.write("in.jsonl", [{"conversations": [{"from": "narrator", "value": "x"}]}])
        with self.assertRaisesRegex(chat_template.ChatDataError,
                                    r"in\.jsonl:1: conversations\[0\]"):
            convert(self.model, path)

    def test_conversation_without_answer_is_left_out_and_counted(self):
        path = self.write("in.jsonl", [{"messages": [{"role": "user", "content": "a"}]},
                                       {"messages": [{"role": "user", "content": "a"},
                                                     {"role": "assistant", "content": "b"}]}])
        records, counts, _ = convert(self.model, path)
        self.assertEqual(counts, {"rendered": 1, "refused": 0, "no_answer": 1})
        self.assertEqual(len(records[0]["assistant_spans"]), 1)
        records, counts, _ = convert(self.model, path, keep_unanswered=True)
        self.assertEqual(counts["rendered"], 2)

    def test_output_directory_is_made_when_missing(self):
        path = self.write("in.jsonl", [{"messages": [{"role": "user", "content": "a"},
                                                     {"role": "assistant", "content": "b"}]}])
        out = os.path.join(self.tmp.name, "new", "dir", "rendered.jsonl")
        with open(os.devnull, "w") as devnull:
            stderr, sys.stderr = sys.stderr, devnull
            try:
                chat_template.main(["--model", self.model, path, out])
            finally:
                sys.stderr = stderr
        with open(out, encoding="utf-8") as f:
            self.assertEqual(len(f.readlines()), 1)

    def test_model_dir_without_tokenizer_config_exits_with_a_message(self):
        path = self.write("in.jsonl", [{"messages": []}])
        with self.assertRaises(SystemExit) as exited:
            chat_template.main(["--model", self.tmp.name, path, path + ".out"])
        self.assertIn("no tokenizer_config.json", str(exited.exception.code))

    def test_no_answer_anywhere_exits_with_a_message(self):
        path = self.write("in.jsonl", [{"messages": [{"role": "user", "content": "a"}]}])
        with self.assertRaises(SystemExit) as exited, \
                open(os.devnull, "w") as devnull:
            stderr, sys.stderr = sys.stderr, devnull
            try:
                chat_template.main(["--model", self.model, path, path + ".out"])
            finally:
                sys.stderr = stderr
        self.assertIn("nothing to train on", str(exited.exception.code))


if __name__ == "__main__":
    if WRITE:
        sys.argv.remove("--write")
    unittest.main()
