"""Streamed text is built by one incremental detokenizer: for any ids, the deltas join into the
final text, that text equals the tokenizer's decoding of the ids, and each character comes
once, whatever the multi-byte characters split across tokens (issue 41, item 2)."""

import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keras_attn_serving.detokenizer import Deltas, Detokenizer
from keras_attn_serving.tokenizer import JsonTextTokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = [
    "to be or not to be, that is the question",
    "café crème, déjà vu, naïve façade",
    "日本語のテキスト 東京 🎉🚀 emoji ✓ and ünïcödé",
    "Ωμέγα, Привет мир, مرحبا",
]
PROMPT = "to be or not to be"


@pytest.fixture(scope="module")
def words():
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return JsonTextTokenizer(tokenizer)


def _expected(words, prompt, new):
    """The continuation as a whole decoding gives it (what the stream must add up to), the
    space before its first word kept: prompt + continuation is the whole text."""
    shown, full = words.decode(prompt), words.decode(prompt + new)
    assert full.startswith(shown)
    return full[len(shown) :]


def _streamed(words, prompt, new, stops=(), reply=False):
    deltas = Deltas(types.SimpleNamespace(words=words), prompt, list(stops), reply)
    pairs = []
    for token in new:
        pairs += deltas.push(token)
        if deltas.stopped:
            break
    else:
        pairs += deltas.rest()
    return pairs


def test_a_character_split_across_tokens_comes_back_once(words):
    prompt = words.encode(PROMPT)
    new = [b for ch in " café 日本 🎉" for b in _byte_ids(words, ch)]
    pairs = _streamed(words, prompt, new)
    assert "".join(delta for _, delta in pairs) == " café 日本 🎉"
    assert [token for token, _ in pairs] == new
    assert PROMPT + " café 日本 🎉" == words.decode(prompt + new)
    # A chat reply drops the space before its first word, with stop strings or without.
    for stops in ((), ["zzzz"], ["\x1e"]):
        joined = "".join(d for _, d in _streamed(words, prompt, new, stops, reply=True))
        assert joined == "café 日本 🎉", stops


def _byte_ids(words, text):
    """One id per UTF-8 byte: the worst split a byte-level model can produce."""
    return [words._tokenizer.token_to_id(BYTE_CHARS[b]) for b in text.encode()]


def _byte_chars():
    """GPT-2's byte -> printable character map, which ByteLevel's alphabet is made of."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        chars[b] = chr(b) if b in printable else chr(256 + extra)
        extra += b not in printable
    return chars


BYTE_CHARS = _byte_chars()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_joined_deltas_equal_the_decoding_of_the_ids(words, data):
    size = words.vocabulary_size
    new = data.draw(st.lists(st.integers(0, size - 1), max_size=30))
    prompt = words.encode(data.draw(st.sampled_from([PROMPT, "café", "日本", "a"])))
    pairs = _streamed(words, prompt, new)
    assert [token for token, _ in pairs] == new
    assert "".join(delta for _, delta in pairs) == _expected(words, prompt, new)
    # The detokenizer alone: the same text, and no piece ever ends mid-character.
    detokenizer = Detokenizer(words.decode, prompt)
    pieces = [detokenizer.push(token) for token in new] + [detokenizer.flush()]
    assert "".join(pieces) == _expected(words, prompt, new)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_stop_strings_cut_the_joined_text_once(words, data):
    new = data.draw(st.lists(st.integers(0, words.vocabulary_size - 1), min_size=1, max_size=30))
    prompt = words.encode(PROMPT)
    full = _expected(words, prompt, new)
    stop = data.draw(st.sampled_from(["é", "日本", " the", "ab", full[2:5] or "x"]))
    pairs = _streamed(words, prompt, new, [stop])
    joined = "".join(delta for _, delta in pairs)
    cut = full.find(stop)
    if cut < 0:
        assert joined == full
    else:
        assert joined == full[:cut] and len(pairs) <= len(new)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_stop_string_that_never_matches_changes_nothing(words, data):
    """Stop strings once switched decoding to keep special tokens' text, which changed where
    a reply's leading spaces were dropped (round four of hostile probes)."""
    new = data.draw(st.lists(st.integers(0, words.vocabulary_size - 1), max_size=20))
    prompt = words.encode(PROMPT)
    for reply in (False, True):
        plain = "".join(d for _, d in _streamed(words, prompt, new, reply=reply))
        stopped = "".join(d for _, d in _streamed(words, prompt, new, ["\x00zz"], reply=reply))
        assert plain == stopped


def test_a_byte_level_token_has_its_own_bytes(words):
    """OpenAI's logprobs `bytes`: a token that is part of a character is its bytes, not the
    replacement character's (239, 191, 189) that decoding it alone gives."""
    text = " café 日本 🎉"
    ids = [b for ch in text for b in _byte_ids(words, ch)]
    assert b"".join(words.token_bytes(i) for i in ids) == text.encode("utf-8")
    assert words.token_bytes(_byte_ids(words, "日")[0]) == "日".encode()[:1]
    whole = words.encode(PROMPT)
    assert b"".join(words.token_bytes(i) for i in whole) == PROMPT.encode()


def test_a_sentencepiece_piece_has_its_own_bytes():
    """Llama's decoder strips the space a lone `▁world` decodes to: its bytes are the
    piece's, ` world`, and a byte-fallback piece is its byte."""
    vocabulary = {"<unk>": 0, "▁world": 1, "world": 2, "<0xE3>": 3, "▁": 4}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    words = JsonTextTokenizer(tokenizer)
    assert [words.token_bytes(i) for i in range(1, 5)] == [b" world", b"world", b"\xe3", b" "]
    assert words.decode([1]) == "world"  # what the server used to report


def test_keras_and_the_server_drop_the_same_space_before_a_reply():
    from keras_attn_serving.detokenizer import REPLY_SPACE

    from keras_attn.models.generation import REPLY_SPACE as KERAS_REPLY_SPACE

    assert REPLY_SPACE == KERAS_REPLY_SPACE == " \t\n\r"
