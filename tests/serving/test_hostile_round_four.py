"""Round four of hostile probes, on the OpenAI routes and the tensor routes: chat with no
`max_tokens` on a rotary model, tensor inputs that disagree, the first word's space, logprobs'
bytes, alternatives and offsets, long id prompts refused before their ids are read, and the
fields OpenAI clients send (null, non-boolean, `0`)."""

import types
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from keras_attn_serving.openai_scores import Offsets
from keras_attn_serving.tokenizer import load_text_tokenizer

from tests.serving.test_openai import CHAT, served  # noqa: F401  the served repository

pytestmark = pytest.mark.tf_only  # the fixture exports with TensorFlow


def post(served, path, body):  # noqa: F811  (the fixture's value, passed on)
    return httpx.post(f"{served.url}{path}", json=body, timeout=60)


def test_chat_without_max_tokens_fills_the_room_left(served):  # noqa: F811
    """The rotary model's manifest has no `max_sequence_length`: the room was 256 new ids
    past the prompt, over the decode graph's 256 positions, so every such request was a 400
    (the `openai` client and LangChain leave `max_tokens` out)."""
    for model in ("chat", "chat-decoder"):
        answer = post(served, "/v1/chat/completions",
                      {"model": model, "messages": CHAT, "temperature": 0})  # fmt: skip
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        assert choice["message"]["content"] == served.lm.generate(CHAT, max_new_tokens=30)
        assert choice["finish_reason"] == "stop"
    long = post(served, "/v1/completions", {"model": "chat", "prompt": [5] * 300})
    assert long.status_code == 400 and "300 tokens" in long.json()["error"]["message"]


def test_tensor_inputs_that_disagree_fail_alone(served):  # noqa: F811
    good = {"inputs": {"token_ids": [[5, 6, 7]], "segment_ids": [[0, 0, 0]]}}
    longer = {"inputs": {"token_ids": [[5, 6, 7, 8, 9]], "segment_ids": [[0, 0, 0]]}}
    rows = {"inputs": {"token_ids": [[5, 6, 7], [5, 6, 7]], "segment_ids": [[0, 0, 0]]}}
    path = "/v1/models/encoder:predict"
    with ThreadPoolExecutor(16) as pool:
        bodies = [longer if k % 8 == 3 else rows if k % 8 == 7 else good for k in range(64)]
        answers = list(pool.map(lambda body: post(served, path, body), bodies))
    for body, answer in zip(bodies, answers, strict=True):
        if body is good:
            assert answer.status_code == 200, answer.text
        else:
            assert answer.status_code == 400, answer.text
            words = "sequence lengths" if body is longer else "as many rows"
            assert words in answer.json()["error"], answer.text


def test_prompt_and_completion_make_the_whole_text(served):  # noqa: F811
    """The first generated piece lost its leading whitespace (`" a"` came back as `"a"`, so
    echo wrote `"to be or nota"`), and only where no stop string was given."""
    words = load_text_tokenizer(served.folder / "chat" / "1" / "tokenizer")
    prompt = "to be or not"
    spaced = 0
    for seed in range(12):
        body = {"model": "chat", "prompt": prompt, "max_tokens": 3, "seed": seed}
        native = post(served, "/v2/models/chat/generate", {
            "text_input": prompt, "parameters": {"max_tokens": 3, "seed": seed,
                                                  "temperature": 1.0}}).json()  # fmt: skip
        text = post(served, "/v1/completions", body).json()["choices"][0]["text"]
        echoed = post(served, "/v1/completions", {**body, "echo": True}).json()
        stopped = post(served, "/v1/completions", {**body, "stop": "\x00never"}).json()
        whole = words.decode(words.encode(prompt) + native["token_ids"])
        assert native["text_output"] == text == stopped["choices"][0]["text"], seed
        assert prompt + text == echoed["choices"][0]["text"] == whole, seed
        spaced += text[:1].isspace()
    assert spaced  # some seed's first token begins with a space: the case is exercised


def test_logprobs_carry_bytes_distinct_alternatives_and_offsets(served):  # noqa: F811
    prompt = "to be or not"
    body = {"model": "chat", "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "logprobs": 5, "echo": True}  # fmt: skip
    choice = post(served, "/v1/completions", body).json()["choices"][0]
    scores = choice["logprobs"]
    assert all(len(top) == 5 for top in scores["top_logprobs"])  # none collapsed
    offsets = scores["text_offset"]
    assert offsets[0] == len(prompt) and offsets == sorted(offsets)
    tokens, whole = scores["tokens"], 0
    for before, token, start in zip(["", *tokens], tokens, offsets, strict=False):
        if not (token + before).startswith("bytes:") and "bytes:" not in before:
            assert choice["text"][start : start + len(token)] == token
            whole += 1
    assert whole >= 4
    chat = post(served, "/v1/chat/completions", {"model": "chat", "messages": CHAT,
                "temperature": 0, "logprobs": True, "top_logprobs": 3}).json()  # fmt: skip
    content = chat["choices"][0]["logprobs"]["content"]
    joined = b"".join(bytes(entry["bytes"]) for entry in content)
    assert joined.decode("utf-8", "replace").lstrip(" ") == chat["choices"][0]["message"]["content"]


def test_offsets_decode_each_id_once():
    """Completions' offsets were summed over every earlier id at each streamed chunk: 2,000
    ids took 3.1 s on the event loop."""
    calls = []

    def decode(ids):
        calls.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    words = types.SimpleNamespace(decode=decode, vocabulary_size=30)
    model = types.SimpleNamespace(words=words, context=lambda prompt: prompt)
    offsets, ids = Offsets(model, [1, 2], start=7), [k % 30 for k in range(2000)]
    for count in range(1, len(ids) + 1):  # one chunk per id, as a stream asks
        starts = offsets.upto(ids, count)
    assert starts[:3] == [7, 8, 9] and starts[-1] == 7 + sum(i < 30 for i in ids[:-1])
    assert len(calls) <= 2 * len(ids) + 2 and max(calls) <= 5


def test_long_id_prompts_are_refused_by_length_before_their_ids_are_read(served):  # noqa: F811
    ids = [5] * 100_000 + [-1]  # a bad id last: the length is what must be named
    for path, field, body in [
        ("/v1/completions", "prompt", {"model": "chat", "prompt": ids}),
        ("/v1/embeddings", "input", {"model": "encoder", "input": ids}),
    ]:
        answer = post(served, path, body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert "100001 tokens" in error["message"] and error["param"] == field


@pytest.mark.parametrize(
    "change, status, param",
    [
        ({"max_tokens": None, "max_completion_tokens": 3}, 200, None),
        ({"max_completion_tokens": None, "max_tokens": 3}, 200, None),
        ({"max_completion_tokens": 2, "max_tokens": 3}, 400, "max_tokens"),
        ({"max_tokens": None, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
        ({"stream": True, "stream_options": {"include_usage": "false"}}, 400, "include_usage"),
        ({"stream": 0}, 400, "stream"),
        ({"logprobs": {}}, 400, "logprobs"),
        ({"frobnicate": 0}, 400, "frobnicate"),
        ({"top_p": 2}, 400, "top_p"),
        ({"stop": [""]}, 400, "stop"),
    ],
)
def test_fields_clients_send(served, change, status, param):  # noqa: F811
    body = {"model": "chat", "messages": CHAT, "max_tokens": 3, "temperature": 0, **change}
    answer = post(served, "/v1/chat/completions", body)
    assert answer.status_code == status, answer.text
    if status == 200:
        assert answer.json()["usage"]["completion_tokens"] <= 3
    else:
        assert answer.json()["error"]["param"] == param, answer.text


def test_an_empty_completions_prompt_is_named_as_sent(served):  # noqa: F811
    for echo in (False, True):
        body = {"model": "chat", "prompt": "", "echo": echo}
        answer = post(served, "/v1/completions", body)
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["param"] == "prompt", answer.text
        assert "`prompt` has no tokens" in error["message"]
    echo = post(served, "/v1/completions", {"model": "chat", "prompt": "x", "echo": ""})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"


def test_v2_json_data_must_be_of_its_datatype(served):  # noqa: F811
    """numpy read `"5"` and `5.7` as the INT32 5, and `"false"` as the BOOL True."""
    from keras_attn_serving.protocol import ServingError, decode_request

    def infer(data, datatype="INT32"):
        tensors = [{"name": "token_ids", "shape": [1, 3], "datatype": datatype, "data": data},
                   {"name": "segment_ids", "shape": [1, 3], "datatype": "INT32",
                    "data": [0, 0, 0]}]  # fmt: skip
        return post(served, "/v2/models/encoder/infer", {"inputs": tensors})

    assert infer([5, 6, 7]).status_code == 200
    assert infer([5, 6, 7], "INT64").status_code == 200  # cast: no value changes
    for data, words in [(["5", "6", "7"], "string"), ([5.7, 6, 7], "fractional"),
                        ([5, 6, 2**33], "outside"), ([True, False, True], "boolean"),
                        ([5, True, 7], "boolean")]:  # fmt: skip
        answer = infer(data)
        assert answer.status_code == 400 and words in answer.json()["error"], answer.text
    for data, words in [(["false"], "string"), ([0], "integer")]:
        body = {"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": data}]}
        with pytest.raises(ServingError, match=words):
            decode_request(__import__("json").dumps(body).encode())
    _, feeds = decode_request(b'{"inputs": [{"name": "x", "shape": [2], "datatype": "BOOL", '
                              b'"data": [false, true]}]}')  # fmt: skip
    assert feeds["x"].tolist() == [False, True]
