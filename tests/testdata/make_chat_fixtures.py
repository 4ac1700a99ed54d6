"""Writes tests/testdata/chat/: chat templates as the models were released,
WITHOUT {% generation %} blocks, over the fixture tokenizers of
tests/testdata/tokenizers/ (which carry the same templates rewritten with
generation blocks, and transformers' renderings and assistant masks).

    python3 tests/testdata/make_chat_fixtures.py     (from the source root)

- chat/<name>/tokenizer_config.json: the sibling fixture's config with
  chat_template replaced by the released template (the tokenizer.json stays
  in tests/testdata/tokenizers/<sibling>/);
- chat/openai.jsonl and chat/sharegpt.jsonl: the sibling fixtures'
  conversations, in OpenAI {"messages"} and ShareGPT {"conversations"} form.
Both released templates render these conversations exactly as the
generation-block versions do, so the assistant masks found from their
prefix renders must equal transformers' masks (tests/python/
chat_template_test.py, and text_corpus_test ReleasedTemplatesGive
TransformersMasks over the rendered files the Python test writes).
"""
import json
import os

ROOT = "tests/testdata"

# meta-llama/Meta-Llama-3-8B-Instruct, tokenizer_config.json "chat_template"
# as released (April 2024).
LLAMA3_RELEASED = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")

# Qwen/Qwen2-7B-Instruct, tokenizer_config.json "chat_template" as released
# (ChatML with a default system prompt).
QWEN2_RELEASED = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# name -> (sibling fixture in tokenizers/, released template)
FIXTURES = {
    "llama3-released": ("llama3-bpe", LLAMA3_RELEASED),
    "qwen2-chatml-released": ("qwen2-bpe", QWEN2_RELEASED),
}

SHAREGPT_FROM = {"user": "human", "assistant": "gpt", "system": "system"}


def main():
    for name, (sibling, template) in FIXTURES.items():
        with open(os.path.join(ROOT, "tokenizers", sibling, "tokenizer_config.json")) as f:
            config = json.load(f)
        config["chat_template"] = template
        os.makedirs(os.path.join(ROOT, "chat", name), exist_ok=True)
        with open(os.path.join(ROOT, "chat", name, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
            f.write("\n")
    with open(os.path.join(ROOT, "tokenizers", "llama3-bpe", "expected.json")) as f:
        chats = json.load(f)["chats"]
    with open(os.path.join(ROOT, "chat", "openai.jsonl"), "w") as f:
        for chat in chats:
            f.write(json.dumps({"messages": chat["messages"]}, ensure_ascii=False) + "\n")
    with open(os.path.join(ROOT, "chat", "sharegpt.jsonl"), "w") as f:
        for chat in chats:
            turns = [{"from": SHAREGPT_FROM[m["role"]], "value": m["content"]}
                     for m in chat["messages"]]
            f.write(json.dumps({"conversations": turns}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
