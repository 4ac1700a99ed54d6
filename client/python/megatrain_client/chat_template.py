"""Chat-format SFT, step 1 of 2: render {"messages": [...]} conversations with
the model's chat template exactly as transformers' apply_chat_template does,
recording where the template's {% generation %} blocks (assistant turns)
fall; `megatrain tokenize --format chat` (step 2, C++) tokenizes the text
with the model's tokenizer.json and turns those spans into the loss mask
(docs/data-format.md, "Chat-format SFT").

    python3 -m megatrain_client.chat_template --model MODEL_DIR in.jsonl out.jsonl

Input: one JSON object per line with "messages" (a list of {"role",
"content", ...}). Output: one JSON object per line,
{"text": rendered, "assistant_spans": [[start, end], ...]} with UTF-8 byte
offsets into "text". A conversation the template refuses
(raise_exception) is skipped and counted on stderr.

No C++ Jinja implementation is packaged in Debian 12 (no inja, no
minja), so rendering uses Debian's python3-jinja2 (the engine transformers
itself uses) with transformers' rules, reproduced from
transformers/utils/chat_template_utils.py (5.x): an
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension, the `tojson` filter (ensure_ascii=False),
`raise_exception` and `strftime_now` globals, the special tokens of
tokenizer_config.json as variables, and the AssistantTracker extension
for {% generation %}. (It does not call transformers even where it is
installed; tests/python/chat_template_test.py checks the output against
transformers' own renderings.)
"""
import argparse
import json
import os
import sys
from contextlib import contextmanager
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """transformers' AssistantTracker: records the [start, end) character
    range that each {% generation %} block adds to the output."""
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(activate_tracker=self.activate_tracker)
        self._rendered_blocks = None
        self._generation_indices = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        rv = caller()
        if self.is_active():
            start_index = len("".join(self._rendered_blocks))
            end_index = start_index + len(rv)
            self._generation_indices.append((start_index, end_index))
        return rv

    def is_active(self):
        return self._rendered_blocks or self._generation_indices

    @contextmanager
    def activate_tracker(self, rendered_blocks, generation_indices):
        try:
            if self.is_active():
                raise ValueError("AssistantTracker should not be reused before closed")
            self._rendered_blocks = rendered_blocks
            self._generation_indices = generation_indices
            yield
        finally:
            self._rendered_blocks = None
            self._generation_indices = None


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def _token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_model_template(model_dir):
    """(template source, special-token variables) of a model directory:
    chat_template.jinja if present, else tokenizer_config.json's
    chat_template (a string, or a list of {"name", "template"}: "default")."""
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    source = None
    jinja_path = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            source = f.read()
    else:
        source = config.get("chat_template")
        if isinstance(source, list):
            source = {t["name"]: t["template"] for t in source}.get("default")
    if not source:
        raise ValueError(f"{model_dir}: no chat template (chat_template.jinja or "
                         "tokenizer_config.json: chat_template)")
    variables = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                "mask_token"):
        if config.get(key) is not None:
            variables[key] = _token_text(config[key])
    return source, variables


def render(template, messages, variables, add_generation_prompt=False):
    """(rendered text, [(start, end)] character spans of generation blocks),
    as apply_chat_template(..., return_assistant_tokens_mask=True)."""
    rendered_blocks = []
    generation_indices = []
    with template.environment.activate_tracker(rendered_blocks, generation_indices):
        for block in template.generate(messages=messages, tools=None, documents=None,
                                       add_generation_prompt=add_generation_prompt, **variables):
            rendered_blocks.append(block)
    return "".join(rendered_blocks), generation_indices


def char_spans_to_bytes(text, spans):
    """Character offsets -> UTF-8 byte offsets."""
    out = []
    for start, end in spans:
        b0 = len(text[:start].encode("utf-8"))
        out.append([b0, b0 + len(text[start:end].encode("utf-8"))])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (tokenizer_config.json)")
    ap.add_argument("input")
    ap.add_argument("output")
    args = ap.parse_args(argv)
    source, variables = load_model_template(args.model)
    template = compile_template(source)
    written = refused = 0
    with open(args.input, encoding="utf-8") as fin, open(args.output, "w", encoding="utf-8") as fout:
        for line_no, line in enumerate(fin, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                messages = record["messages"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SystemExit(f"{args.input}:{line_no}: not a {{\"messages\": [...]}} object ({e})")
            try:
                text, spans = render(template, messages, variables)
            except jinja2.exceptions.TemplateError as e:
                print(f"{args.input}:{line_no}: the template refuses the conversation: {e}",
                      file=sys.stderr)
                refused += 1
                continue
            fout.write(json.dumps({"text": text,
                                   "assistant_spans": char_spans_to_bytes(text, spans)},
                                  ensure_ascii=False) + "\n")
            written += 1
    print(f"{written} conversations rendered, {refused} refused by the template", file=sys.stderr)


if __name__ == "__main__":
    main()
