"""Chat-format SFT, step 1 of 2: render conversations with the model's chat
template exactly as transformers' apply_chat_template does, and record which
bytes are the assistant's answers (the loss mask) and where each turn lies;
`megatrain tokenize --format chat` (step 2, C++) tokenizes the text with the
model's tokenizer.json, turns the spans into the loss mask and, for a
conversation over --max_document_tokens, drops its oldest turns
(docs/data-format.md, "Chat-format SFT").

    python3 -m megatrain_client.chat_template --model MODEL_DIR in.jsonl out.jsonl

Input: one JSON object per line, either OpenAI-style {"messages": [{"role",
"content", ...}, ...]} or ShareGPT-style {"conversations": [{"from",
"value"}, ...]} (from: human -> user, gpt -> assistant, system, tool).
Output: one JSON object per line,
    {"text": rendered, "assistant_spans": [[start, end], ...],
     "turns": [{"role": r, "start": s, "end": e}, ...]}
with UTF-8 byte offsets into "text". A conversation the template refuses
(raise_exception) is skipped and counted on stderr; so is one with no
assistant answer (it would train on nothing).

Note [Assistant spans]
Two ways to find the answers, chosen by --assistant_mask (auto: the first
when the template has {% generation %} blocks, else the second):
  - generation: the spans the template's {% generation %} blocks write, as
    transformers' return_assistant_tokens_mask computes them;
  - prefixes: for assistant message i, the text that rendering messages[:i+1]
    adds to rendering messages[:i] with add_generation_prompt=True (the
    prompt header stays a prompt), less trailing whitespace (the newline a
    template writes between turns, which the model never generates: it stops
    at its end-of-turn token). This is how TRL and axolotl mask templates
    without generation blocks (the released Llama 3 and Qwen templates). It
    needs every prefix to render as a prefix of the whole conversation; a
    template that rewrites earlier turns (one that drops past reasoning)
    does not, and such a conversation is refused with a message saying to
    add {% generation %} blocks.
tests/python/chat_template_test.py checks that both give the same spans on
every template that has generation blocks. Turns always come from the prefix
renders (omitted where the template is not prefix-stable; the tokenizer
then drops a conversation too long to keep whole).

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
import re
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


class ChatDataError(ValueError):
    """A model directory or an input line this module cannot use; the
    message names the file (and line) and says what to do."""


def load_model_template(model_dir):
    """(template source, special-token variables) of a model directory:
    chat_template.jinja if present, else tokenizer_config.json's
    chat_template (a string, or a list of {"name", "template"}: "default").
    ChatDataError naming the file when the directory lacks them."""
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isdir(model_dir):
        raise ChatDataError(f"--model {model_dir}: not a directory (give the model directory "
                            "that holds tokenizer_config.json)")
    if not os.path.exists(config_path):
        raise ChatDataError(f"--model {model_dir}: no tokenizer_config.json (the special tokens "
                            "and the chat template come from it; copy it from the model's "
                            "release beside tokenizer.json)")
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ChatDataError(f"{config_path}: cannot read it as JSON ({e})") from e
    if not isinstance(config, dict):
        raise ChatDataError(f"{config_path}: expected a JSON object")
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
        raise ChatDataError(f"{model_dir}: no chat template (chat_template.jinja or "
                            "tokenizer_config.json: chat_template)")
    variables = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                "mask_token"):
        if config.get(key) is not None:
            variables[key] = _token_text(config[key])
    return source, variables


# ShareGPT "from" values and the roles they stand for.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


def conversation_messages(record, where):
    """The OpenAI-style message list of one input record: {"messages": [...]}
    as it is, {"conversations": [{"from", "value"}]} (ShareGPT) converted.
    ChatDataError naming `where` (file:line) for anything else."""
    if not isinstance(record, dict):
        raise ChatDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ChatDataError(f"{where}: \"messages\" must be a list of "
                                "{\"role\": ..., \"content\": ...} objects")
        return messages
    if "conversations" in record:
        turns = record["conversations"]
        if not isinstance(turns, list):
            raise ChatDataError(f"{where}: \"conversations\" must be a list of "
                                "{\"from\": ..., \"value\": ...} objects")
        messages = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, dict) or turn.get("from") not in SHAREGPT_ROLES or \
                    not isinstance(turn.get("value"), str):
                raise ChatDataError(
                    f"{where}: conversations[{k}] must be {{\"from\": one of "
                    f"{sorted(SHAREGPT_ROLES)}, \"value\": string}}, got {json.dumps(turn)[:200]}")
            messages.append({"role": SHAREGPT_ROLES[turn["from"]], "content": turn["value"]})
        return messages
    hint = ""
    if "text" in record:
        hint = ("; this looks like a text corpus: tokenize it with `megatrain tokenize "
                "--format jsonl` (no chat template)")
    raise ChatDataError(f"{where}: expected {{\"messages\": [{{\"role\", \"content\"}}, ...]}} "
                        f"(OpenAI) or {{\"conversations\": [{{\"from\", \"value\"}}, ...]}} "
                        f"(ShareGPT), got the keys {sorted(record)[:10]}{hint}")


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


GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")


def has_generation_blocks(source):
    return GENERATION_TAG.search(source) is not None


class NotPrefixStable(Exception):
    """The template renders a prefix of the conversation as something that
    is not a prefix of the whole (Note [Assistant spans])."""


def _try_render(template, messages, variables, add_generation_prompt):
    try:
        return render(template, messages, variables, add_generation_prompt)[0]
    except (jinja2.exceptions.TemplateError, IndexError, KeyError, TypeError):
        # A template that cannot render this prefix (one that reads
        # messages[0] of an empty list): that prefix gives no boundary.
        return None


def prefix_turns(template, messages, variables, full):
    """[(role, start, end)] character ranges of each message's text in
    `full` (the whole conversation rendered): message i adds what rendering
    messages[:i+1] adds to messages[:i]. NotPrefixStable when a render is
    not a prefix of `full`."""
    turns = []
    start = 0
    for i, message in enumerate(messages):
        upto = full if i + 1 == len(messages) else _try_render(template, messages[:i + 1],
                                                               variables, False)
        if upto is None or not full.startswith(upto) or len(upto) < start:
            raise NotPrefixStable(f"rendering the first {i + 1} messages does not give a "
                                  "prefix of the whole conversation")
        turns.append((message["role"], start, len(upto)))
        start = len(upto)
    return turns


def prefix_assistant_spans(template, messages, variables, full, turns):
    """Note [Assistant spans], prefixes: [(start, end)] character spans of
    the assistant messages' answers in `full`."""
    spans = []
    for i, (role, turn_start, turn_end) in enumerate(turns):
        if role != "assistant":
            continue
        start = turn_start
        prompt = _try_render(template, messages[:i], variables, True) if i > 0 else None
        if prompt is not None and full.startswith(prompt) and turn_start <= len(prompt) <= turn_end:
            start = len(prompt)
        end = turn_end
        while end > start and full[end - 1].isspace():
            end -= 1
        if end > start:
            spans.append((start, end))
    return spans


def render_conversation(template, messages, variables, mask_from):
    """(text, assistant character spans, turns or None) of one
    conversation; mask_from is "generation" or "prefixes". Raises
    jinja2 TemplateError when the template refuses it and NotPrefixStable
    when "prefixes" cannot be used."""
    text, generation_spans = render(template, messages, variables)
    try:
        turns = prefix_turns(template, messages, variables, text)
    except NotPrefixStable:
        if mask_from == "prefixes":
            raise
        turns = None
    if mask_from == "generation":
        return text, generation_spans, turns
    return text, prefix_assistant_spans(template, messages, variables, text, turns), turns


def conversation_record(text, spans, turns):
    """The output line's object (byte offsets)."""
    record = {"text": text, "assistant_spans": char_spans_to_bytes(text, spans)}
    if turns is not None:
        byte_ranges = char_spans_to_bytes(text, [(s, e) for _, s, e in turns])
        record["turns"] = [{"role": role, "start": b[0], "end": b[1]}
                           for (role, _, _), b in zip(turns, byte_ranges)]
    return record


def convert(args, log=None):
    """Renders args.input into args.output; returns the counts. Messages go
    to `log` (default stderr)."""
    log = log if log is not None else sys.stderr
    source, variables = load_model_template(args.model)
    mask_from = args.assistant_mask
    if mask_from == "auto":
        mask_from = "generation" if has_generation_blocks(source) else "prefixes"
    if mask_from == "generation" and not has_generation_blocks(source):
        raise ChatDataError(f"--assistant_mask generation: the chat template of {args.model} has "
                            "no {% generation %} blocks; use --assistant_mask prefixes")
    template = compile_template(source)
    counts = {"rendered": 0, "refused": 0, "no_answer": 0}
    # As `megatrain tokenize --out` does, the output's directory is made.
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.input, encoding="utf-8") as fin, open(args.output, "w", encoding="utf-8") as fout:
        for line_no, line in enumerate(fin, 1):
            if not line.strip():
                continue
            where = f"{args.input}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ChatDataError(f"{where}: invalid JSON ({e})") from e
            messages = conversation_messages(record, where)
            try:
                text, spans, turns = render_conversation(template, messages, variables, mask_from)
            except (jinja2.exceptions.TemplateError, NotPrefixStable) as e:
                fix = ("; add {% generation %} blocks to the template"
                       if isinstance(e, NotPrefixStable) else "")
                print(f"{where}: the template refuses the conversation: {e}{fix}", file=log)
                counts["refused"] += 1
                continue
            if not spans and not args.keep_unanswered:
                counts["no_answer"] += 1
                continue
            fout.write(json.dumps(conversation_record(text, spans, turns), ensure_ascii=False) + "\n")
            counts["rendered"] += 1
    how = ("{% generation %} blocks" if mask_from == "generation"
           else "prefix renders (Note [Assistant spans])")
    print(f"{counts['rendered']} conversations rendered, {counts['refused']} refused by the "
          f"template, {counts['no_answer']} without an assistant answer left out; assistant "
          f"masks from {how}", file=log)
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory (tokenizer_config.json)")
    ap.add_argument("--assistant_mask", choices=["auto", "generation", "prefixes"], default="auto",
                    help="how to find the answers (Note [Assistant spans]); auto: generation "
                         "when the template has {%% generation %%} blocks, else prefixes")
    ap.add_argument("--keep_unanswered", action="store_true",
                    help="write conversations without an assistant answer too")
    ap.add_argument("input")
    ap.add_argument("output", help="rendered JSONL (its directory is made if missing)")
    args = ap.parse_args(argv)
    try:
        counts = convert(args)
    except (ChatDataError, OSError) as e:
        raise SystemExit(f"megatrain_client.chat_template: {e}") from None
    if counts["rendered"] == 0:
        raise SystemExit("megatrain_client.chat_template: no conversation with an assistant "
                         f"answer in {args.input}; nothing to train on")


if __name__ == "__main__":
    main()
