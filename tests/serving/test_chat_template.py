"""Chat templates rendered as `transformers` renders them: the same text and, through the
served tokenizer, the same ids as `apply_chat_template`, on ChatML, Llama-3 and a template
that uses the helpers (namespace, loop controls, tojson, raise_exception)."""

import itertools
import json

import pytest
from keras_attn_serving.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    check_conversation,
    read_chat_template,
)
from keras_attn_serving.tokenizer import JsonTextTokenizer

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
# Mistral-style: alternation enforced with raise_exception; namespace, loop controls, tojson.
HELPERS = """{%- set ns = namespace(system='', turns=0) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- set ns.system = message.content %}
        {%- continue %}
    {%- endif %}
    {%- if (message.role == 'user') != (ns.turns % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.role == 'user' %}
        {{- bos_token if loop.first or loop.index0 == 1 and ns.system else '' }}[INST] {{
            (ns.system + '\\n\\n' if ns.system and ns.turns == 1 else '') + message.content
        }} [/INST]
    {%- else %}
        {{- ' ' + message.content + eos_token }}
    {%- endif %}
    {%- if ns.turns > 40 %}{% break %}{% endif %}
{%- endfor %}
{%- if tools %}{{ tools | tojson }}{% endif %}
"""
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>"]  # fmt: skip
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

USER_TEXTS = [
    "Hello!", "", "What is 2+2?", "  spaced  out  ", "naïve café — 日本語 🙂",
    "{{ messages }} {% for x in y %}", "say <|im_end|> please", "<|eot_id|>", "line\none\n\ntwo",
    "{{ raise_exception('x') }}", "tab\there", "ÄÖÜ ß",
]  # fmt: skip
ANSWERS = ["Hi there.", "4", "", "Sure: 🙂", "<|im_start|>assistant"]
SYSTEMS = [None, "You are terse.", "", "Système: réponds en français."]


def conversations(count=60):
    """`count` conversations: 1 to 3 turns, with and without a system prompt, the user texts
    above (template syntax and special-token strings among them) and Unicode answers."""
    texts, answers = itertools.cycle(USER_TEXTS), itertools.cycle(ANSWERS)
    out = []
    for n in range(count):
        system = SYSTEMS[n % len(SYSTEMS)]
        messages = [] if system is None else [{"role": "system", "content": system}]
        for turn in range(n % 3 + 1):
            messages.append({"role": "user", "content": next(texts)})
            if turn < n % 3:
                messages.append({"role": "assistant", "content": next(answers)})
        out.append(messages)
    return out


@pytest.fixture(scope="module")
def tokenizers_pair(tmp_path_factory):
    """A byte-level BPE tokenizer.json with the templates' special tokens, as the served
    tokenizer and as `transformers`' fast tokenizer over the same file."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [t for t in USER_TEXTS + ANSWERS + [s or "" for s in SYSTEMS]] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("chat") / "tokenizer.json"
    tokenizer.save(str(path))
    ours = JsonTextTokenizer(Tokenizer.from_file(str(path)))
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(path), **TOKENS)
    return ours, theirs


@pytest.mark.parametrize("source", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_text_and_ids_equal_transformers_on_every_conversation(tokenizers_pair, source):
    ours, theirs = tokenizers_pair
    chat = ChatTemplate(source, TOKENS)
    cases = conversations()
    for messages, generation_prompt in itertools.product(cases, (True, False)):
        text = chat.render(messages, add_generation_prompt=generation_prompt)
        expected = theirs.apply_chat_template(
            messages, chat_template=source, tokenize=False,
            add_generation_prompt=generation_prompt,
        )  # fmt: skip
        assert text == expected, messages
        ids = theirs.apply_chat_template(
            messages, chat_template=source, add_generation_prompt=generation_prompt,
            return_dict=False,
        )  # fmt: skip
        assert ours.encode(text) == list(ids), messages
    assert len(cases) >= 50


def test_helpers_and_variables_equal_transformers(tokenizers_pair):
    _, theirs = tokenizers_pair
    chat = ChatTemplate(HELPERS, TOKENS)
    tools = [{"type": "function", "function": {"name": "météo", "parameters": {}}}]
    checked = 0
    for messages in conversations():
        kwargs = {"tools": tools} if len(messages) % 2 else {}
        try:
            expected = theirs.apply_chat_template(
                messages, chat_template=HELPERS, tokenize=False, **kwargs
            )
        except Exception as error:  # alternation broken: ours raises with the same message
            with pytest.raises(ChatTemplateError, match="roles must alternate"):
                chat.render(messages, add_generation_prompt=False, **kwargs)
            assert "roles must alternate" in str(error)
            continue
        assert chat.render(messages, add_generation_prompt=False, **kwargs) == expected
        checked += 1
    assert checked >= 30


def test_continue_final_message_equals_transformers(tokenizers_pair):
    _, theirs = tokenizers_pair
    messages = [{"role": "user", "content": "Name a colour"},
                {"role": "assistant", "content": "The colour is"}]  # fmt: skip
    for source in (CHATML, LLAMA3):
        expected = theirs.apply_chat_template(
            messages, chat_template=source, tokenize=False, continue_final_message=True
        )
        got = ChatTemplate(source, TOKENS).render(
            messages, add_generation_prompt=False, continue_final_message=True
        )
        assert got == expected and got.endswith("The colour is")


def test_strftime_now_and_the_sandbox():
    assert ChatTemplate("{{ strftime_now('%Y') }}").render([{"role": "user", "content": ""}])[
        :2] == "20"  # fmt: skip
    escape = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(ChatTemplateError, match="raised"):
        ChatTemplate(escape).render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="underscore"):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"content": "x"}], r"messages\[0\].role"),
        ([{"role": "user", "content": 3}], r"messages\[0\].content"),
        ([{"role": "user", "content": "x"}, "y"], r"messages\[1\]"),
        ([{"role": "user", "content": object()}], "JSON data"),
    ],
)
def test_bad_conversations_are_named(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        check_conversation(messages)


def test_template_errors_carry_their_message():
    with pytest.raises(ChatTemplateError, match=r"does not compile.*line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="no system prompts here"):
        ChatTemplate("{{ raise_exception('no system prompts here') }}").render(
            [{"role": "system", "content": "x"}]
        )
    with pytest.raises(ChatTemplateError, match="failed: TypeError"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user", "content": "x"}])


def test_read_chat_template_takes_every_form_transformers_writes(tmp_path, tokenizers_pair):
    _, theirs = tokenizers_pair
    theirs.chat_template = CHATML
    theirs.save_pretrained(tmp_path / "saved")  # transformers 5 writes chat_template.jinja
    source, tokens = read_chat_template(tmp_path / "saved")
    assert source == CHATML and tokens == TOKENS
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": [{"name": "tool_use", "template": "x"},
                          {"name": "default", "template": LLAMA3}],
        "bos_token": {"content": "<|begin_of_text|>", "lstrip": False},
    }))  # fmt: skip
    assert read_chat_template(tmp_path / "named") == (LLAMA3, {"bos_token": "<|begin_of_text|>"})
    (tmp_path / "none").mkdir()
    assert read_chat_template(tmp_path / "none") == (None, {})
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer_config.json").write_text('{"chat_template": 3}')
    with pytest.raises(ChatTemplateError, match="chat_template` must be a string"):
        read_chat_template(tmp_path / "bad")
