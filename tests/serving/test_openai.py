"""The OpenAI-compatible routes, driven by the official `openai` client (sync, async and
streaming) against a chat checkpoint `transformers` wrote, exported and served: the replies
are Keras `generate`'s on the same conversation, and errors come in OpenAI's shape."""

import asyncio
import base64
import json
import shutil
from types import SimpleNamespace

import httpx
import keras
import numpy as np
import pytest
from keras_attn_serving.detokenizer import Deltas
from keras_attn_serving.server import ModelRepository, create_app
from keras_attn_serving.tokenizer import load_text_tokenizer

from keras_attn.models import CausalLM
from tests.chat_folder import set_end_tokens, write_chat_folder
from tests.serving.test_server import serve_in_thread
from tests.serving.test_text import keras_ids, packer_for, run

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.tf_only  # the fixtures export with TensorFlow

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "to be or not"}]
TEXTS = ["to be or not to be", "the slings and arrows"]
DEEP = json.loads("[" * 600 + "]" * 600)


@pytest.fixture(scope="module")
def served(tmp_path_factory, toy_tokenizer, toy_artifact):
    """A repository with `chat` (Qwen2 layout, ChatML, an end-of-turn id greedy reaches),
    `encoder` (embeddings) and `lm` (no chat template); the chat model in Keras too."""
    from keras_attn_export import export_model

    from keras_attn.models import Encoder

    root = tmp_path_factory.mktemp("openai")
    folder = root / "hf"
    _, tokenizer = write_chat_folder(folder)
    lm = CausalLM.from_pretrained(folder, preprocessor=None)
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_dict=False)
    free = lm.generate([list(ids)], max_new_tokens=16, stop_token_ids=[])[0]
    k = next(k for k in range(3, 16) if free[k] not in free[:k])
    set_end_tokens(folder, [free[k]])  # greedy ends its turn after k ids
    lm = CausalLM.from_pretrained(folder)
    export_model(lm, root / "repo" / "chat" / "1", formats=["onnx"], verbose=False)
    # The same model exported as large models are: its decode graph alone.
    export_model(lm, root / "repo" / "chat-decoder" / "1", formats=["generation"], verbose=False)
    keras.utils.set_random_seed(0)
    encoder = Encoder(toy_tokenizer.vocabulary_size(), 24, hidden_dim=16, num_layers=1,
                      num_heads=2)  # fmt: skip
    export_model(encoder, root / "repo" / "encoder" / "1", tokenizer=toy_tokenizer,
                 packer=packer_for(toy_tokenizer), formats=["onnx"], verbose=False)  # fmt: skip
    shutil.copytree(toy_artifact[0], root / "repo" / "lm" / "1")
    reranker = _reranker(toy_tokenizer)
    export_model(reranker, root / "repo" / "reranker" / "1", formats=["onnx"], verbose=False)
    url, stop = serve_in_thread(create_app(ModelRepository(root / "repo")))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    yield SimpleNamespace(url=url, client=client, lm=lm, encoder=encoder, k=k, free=free,
                          prompt_ids=list(ids), folder=root / "repo",
                          reranker=reranker)  # fmt: skip
    stop()


def _reranker(tokenizer):
    """A cross-encoder: `[CLS] query [SEP] document [SEP]` -> one relevance logit."""
    from keras_attn.models import Encoder, SequenceClassifier
    from keras_attn.preprocessing import SegmentPacker, TextPreprocessor

    keras.utils.set_random_seed(4)
    cls, sep = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]"))
    packer = SegmentPacker(12, start_value=cls, end_value=sep)  # short: pairs get trimmed
    encoder = Encoder(tokenizer.vocabulary_size(), 12, hidden_dim=16, num_layers=1,
                      num_heads=2)  # fmt: skip
    return SequenceClassifier(encoder, 1, dropout=0.0,
                              preprocessor=TextPreprocessor(tokenizer, packer))  # fmt: skip


def test_models_lists_the_repository(served):
    assert sorted(m.id for m in served.client.models.list()) == [
        "chat", "chat-decoder", "encoder", "lm", "reranker"]  # fmt: skip


def test_rerank_orders_documents_by_the_keras_scores(served):
    from keras_attn.preprocessing.preprocessor import model_inputs

    query = "to be or not to be"
    documents = [TEXTS[1], "whether tis nobler in the mind to suffer the slings", "sleep",
                 query, "the question"]  # fmt: skip
    model = served.reranker
    features = model.preprocessor(([query] * len(documents), documents))
    logits = keras.ops.convert_to_numpy(model(model_inputs(features, model.input)))[:, 0]
    expected = 1 / (1 + np.exp(-logits.astype(np.float64)))
    for path in ("/v1/rerank", "/rerank"):
        body = {"model": "reranker", "query": query, "documents": documents, "top_n": 3}
        answer = httpx.post(f"{served.url}{path}", json=body).json()
        results = answer["results"]
        assert [r["index"] for r in results] == list(np.argsort(-expected)[:3])
        np.testing.assert_allclose([r["relevance_score"] for r in results],
                                   np.sort(expected)[::-1][:3], atol=1e-5)  # fmt: skip
        assert results[0]["document"]["text"] == documents[results[0]["index"]]
    for bad, param in [({"query": "", "documents": ["a"]}, "query"),
                       ({"query": "a", "documents": []}, "documents"),
                       ({"query": "a", "documents": ["b"], "top_n": 0}, "top_n")]:  # fmt: skip
        response = httpx.post(f"{served.url}/v1/rerank", json={"model": "reranker", **bad})
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    one = httpx.post(f"{served.url}/v1/rerank", json={
        "model": "encoder", "query": "a", "documents": ["b"]})  # fmt: skip
    assert one.status_code == 400 and "task is 'embed'" in one.json()["error"]["message"]


def test_chat_equals_keras_and_ends_at_the_checkpoints_end_of_turn(served):
    answer = served.client.chat.completions.create(model="chat", messages=CHAT, max_tokens=30,
                                                   temperature=0)  # fmt: skip
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == served.lm.generate(CHAT, max_new_tokens=30)
    assert choice.finish_reason == "stop"  # no stop given: the checkpoint's end id
    assert answer.usage.prompt_tokens == len(served.prompt_ids)
    assert answer.usage.completion_tokens == served.k
    short = served.client.chat.completions.create(
        model="chat", messages=CHAT, max_completion_tokens=2, temperature=0
    )
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2


def test_a_generation_only_export_chats_as_the_full_one_and_refuses_ids_inference(served):
    answers = [
        served.client.chat.completions.create(model=name, messages=CHAT, max_tokens=30,
                                              temperature=0).choices[0].message.content
        for name in ("chat", "chat-decoder")
    ]  # fmt: skip
    assert answers[0] == answers[1] == served.lm.generate(CHAT, max_new_tokens=30)
    body = {"inputs": [{"name": "token_ids", "shape": [1, 3], "datatype": "INT32",
                        "data": [1, 2, 3]}]}  # fmt: skip
    refused = httpx.post(f"{served.url}/v2/models/chat-decoder/infer", json=body)
    assert refused.status_code == 400 and "generation only" in refused.json()["error"]
    assert httpx.post(f"{served.url}/v2/models/chat/infer", json=body).status_code == 200


def test_streamed_chat_joins_into_the_answer_and_reports_usage(served):
    whole = served.client.chat.completions.create(model="chat", messages=CHAT, max_tokens=30,
                                                  temperature=0)  # fmt: skip
    chunks = list(served.client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=30, stream=True, temperature=0,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == served.k


def test_n_choices_draw_with_consecutive_seeds_as_keras_does(served):
    answer = served.client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=6, n=2, temperature=1.0, seed=5, top_p=0.9
    )
    assert [c.index for c in answer.choices] == [0, 1]
    for choice, seed in zip(answer.choices, (5, 6), strict=True):
        expected = served.lm.generate(CHAT, max_new_tokens=6, sampler="sample", seed=seed,
                                      temperature=1.0, top_p=0.9)  # fmt: skip
        assert choice.message.content == expected
    streamed = served.client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=6, n=2, temperature=1.0, seed=5, top_p=0.9,
        stream=True,
    )  # fmt: skip
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in answer.choices]


def test_the_async_client(served):
    async def ask():
        client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused")
        answers = await asyncio.gather(*(
            client.chat.completions.create(model="chat", messages=CHAT, max_tokens=30,
                                           temperature=0)
            for _ in range(3)
        ))  # fmt: skip
        await client.close()
        return [a.choices[0].message.content for a in answers]

    expected = served.lm.generate(CHAT, max_new_tokens=30)
    assert asyncio.run(ask()) == [expected] * 3


def test_completions_take_text_and_ids_and_echo(served):
    client = served.client
    answer = client.completions.create(model="chat", prompt=[served.prompt_ids], max_tokens=30,
                                       temperature=0)  # fmt: skip
    assert answer.choices[0].text == served.lm.generate(CHAT, max_new_tokens=30)
    assert answer.choices[0].finish_reason == "stop"
    text = client.completions.create(model="lm", prompt="to be or", max_tokens=4, echo=True,
                                     temperature=0)  # fmt: skip
    native = httpx.post(
        f"{served.url}/v2/models/lm/generate",
        json={"text_input": "to be or", "parameters": {"max_tokens": 4}},
    ).json()
    assert text.choices[0].text == "to be or" + native["text_output"]
    assert text.usage.completion_tokens == len(native["token_ids"])
    two = client.completions.create(model="lm", prompt=["to be", "or not"], max_tokens=3)
    assert [c.index for c in two.choices] == [0, 1]
    streamed = client.completions.create(model="lm", prompt="to be or", max_tokens=4,
                                         stream=True, temperature=0)  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed if c.choices) == native["text_output"]


def test_embeddings_equal_keras_in_floats_and_base64(served, toy_tokenizer):
    ids = keras_ids(toy_tokenizer, TEXTS)
    outputs = run(served.encoder, ids)
    real = (ids != 0)[..., None]
    mean = (outputs["sequence_output"] * real).sum(1) / real.sum(1)
    answer = served.client.embeddings.create(model="encoder", input=TEXTS)
    got = np.array([d.embedding for d in answer.data])
    np.testing.assert_allclose(got, mean, atol=1e-5)
    assert answer.usage.prompt_tokens == int((ids != 0).sum())
    raw = httpx.post(f"{served.url}/v1/embeddings", json={
        "model": "encoder", "input": TEXTS, "encoding_format": "base64"}).json()  # fmt: skip
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in raw["data"]]
    np.testing.assert_allclose(decoded, mean, atol=1e-5)
    unpacked = ids[0][ids[0] != 0][1:-1].tolist()  # the tokenizer's ids: packed as text's are
    by_ids = served.client.embeddings.create(model="encoder", input=[unpacked])
    np.testing.assert_allclose(by_ids.data[0].embedding, mean[0], atol=1e-5)


@pytest.mark.parametrize(
    "call, status, match, param",
    [
        ({"model": "nope", "messages": CHAT}, 404, r"not served; served models: \['chat'", "model"),
        ({"model": "chat", "messages": CHAT, "temperature": -1}, 400, "temperature", "temperature"),
        ({"model": "chat", "messages": CHAT, "n": 9}, 400, "`n` must be", "n"),
        ({"model": "chat", "messages": [{"content": "x"}]}, 400, "role", "messages"),
        (
            {"model": "chat", "messages": CHAT, "logit_bias": {"5": 9}},
            400,
            "unsupported",
            "logit_bias",
        ),
        ({"model": "lm", "messages": CHAT}, 400, "no chat template", "messages"),
        ({"model": "encoder", "messages": CHAT}, 400, "task is 'embed'", None),
        ({"model": "chat", "messages": CHAT, "max_tokens": 10**6}, 400, "maximum sequence", None),
        (
            {"model": "chat", "messages": [{"role": "user", "content": "\ud800"}]},
            400,
            "not valid Unicode",
            "messages",
        ),
        (
            {"model": "chat", "messages": [{"role": "user", "content": "x", "deep": DEEP}]},
            400,
            "nested more than",
            "messages",
        ),
        (
            {
                "model": "chat",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ],
            },
            400,
            "text part",
            "messages",
        ),
        ({"model": "chat", "messages": CHAT, "seed": -1}, 400, "seed", "seed"),
        (
            {"model": "chat", "messages": CHAT, "stream_options": {"include_usage": True}},
            400,
            "needs `stream: true`",
            "stream_options",
        ),
    ],
)
def test_errors_come_in_openais_shape(served, call, status, match, param):
    response = httpx.post(f"{served.url}/v1/chat/completions", content=json.dumps(call),
                          headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert __import__("re").search(match, error["message"]), error
    if "\\ud800" in json.dumps(call):
        return  # the client cannot send a lone surrogate (raw HTTP clients can)
    with pytest.raises(openai.APIStatusError) as raised:
        served.client.chat.completions.create(**call)
    assert raised.value.status_code == status


def test_stop_strings_match_special_tokens_and_answers_leave_them_out(served):
    words = load_text_tokenizer(served.folder / "chat" / "1" / "tokenizer")
    ids = words.encode("to be<|im_end|> or not")
    model = SimpleNamespace(words=words)

    def text(stops):
        deltas, pairs = Deltas(model, [5], stops), []
        for token in ids:  # as `TextModel.stream` runs it: a stop ends the ids
            pairs += deltas.push(token)
            if deltas.stopped:
                return "".join(d for _, d in pairs)
        return "".join(d for _, d in pairs + deltas.rest())

    assert text(["<|im_end|>"]) == "to be"
    assert text([" or"]) == "to be"  # the special token's text left out
    assert text(["zzz"]) == "to be or not"
    assert text(["im_", "|>"]) == "to be or not"  # never inside a special token's text
    # Text held for an incomplete character before the stopping token is still sent.
    ids = [*words.encode("to be"), words.encode("日")[0], *words.encode("<|im_end|>")]
    assert text(["<|im_end|>"]) == "to be\ufffd"


def test_content_parts_inert_defaults_and_bad_ids(served):
    parts = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "to be"}, {"type": "text", "text": "or not"}]}]  # fmt: skip
    joined = [CHAT[0], {"role": "user", "content": "to be\nor not"}]
    answer = served.client.chat.completions.create(
        model="chat", messages=parts, max_tokens=5, temperature=0, logprobs=False, tools=[],
    )  # fmt: skip
    assert answer.choices[0].message.content == served.lm.generate(joined, max_new_tokens=5)
    for prompt in ([-1], [2**40], [[3, 4], []]):
        response = httpx.post(f"{served.url}/v1/completions",
                              json={"model": "chat", "prompt": prompt}, timeout=60)  # fmt: skip
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "prompt"
    response = httpx.post(f"{served.url}/v1/embeddings", json={"model": "encoder", "input": 3})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"


def test_keras_chat_takes_a_stop_string(served):
    reply = served.lm.generate(CHAT, max_new_tokens=30)
    cut = reply[1:3]
    assert served.lm.generate(CHAT, max_new_tokens=30, stop_strings=cut) == reply[
        : reply.index(cut)]  # fmt: skip


def _keras_log_softmax(lm, ids):
    logits = keras.ops.convert_to_numpy(lm(np.array([ids], "int32")))[0].astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_logprobs_are_keras_log_softmax_streamed_or_not(served):
    answer = served.client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = answer.choices[0].logprobs.content
    new = served.free[: min(5, served.k)]  # the turn ends at its end id
    assert len(content) == len(new)
    scores = _keras_log_softmax(served.lm, served.prompt_ids + new)
    for i, (entry, token) in enumerate(zip(content, new, strict=True)):
        row = scores[len(served.prompt_ids) - 1 + i]
        assert entry.logprob == pytest.approx(row[token], abs=1e-4)
        expected_top = np.argsort(-row)[:3]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(row[expected_top],
                                                                        abs=1e-4)  # fmt: skip
        assert entry.top_logprobs[0].token == entry.token  # greedy: the top one
    chunks = served.client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
        top_logprobs=3, stream=True,
    )  # fmt: skip
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    text = served.client.completions.create(model="chat", prompt=[served.prompt_ids],
                                            max_tokens=5, temperature=0, logprobs=2)  # fmt: skip
    logprobs = text.choices[0].logprobs
    assert logprobs.token_logprobs == pytest.approx([e.logprob for e in content], abs=1e-6)
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age"], "additionalProperties": False,
}  # fmt: skip


def test_json_schema_output_always_parses_and_validates(served):
    jsonschema = pytest.importorskip("jsonschema")
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    valid = 0
    for seed in range(20):  # sampled: a random model, held to the schema by the grammar
        answer = served.client.chat.completions.create(
            model="chat", messages=CHAT, max_tokens=80, temperature=1.0, seed=seed,
            response_format=format_,
        )  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        valid += 1
    assert valid == 20
    anything = served.client.chat.completions.create(
        model="chat", messages=CHAT, max_tokens=60, temperature=0.7, seed=1, n=2,
        response_format={"type": "json_object"},
    )  # fmt: skip
    for choice in anything.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
    for bad, match in [({"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}},
                        "objekt"), ({"type": "xml"}, "'xml'")]:  # fmt: skip
        response = httpx.post(f"{served.url}/v1/chat/completions", json={
            "model": "chat", "messages": CHAT, "response_format": bad}, timeout=60)  # fmt: skip
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "response_format" and match in error["message"]


def test_a_shared_prefix_is_served_from_the_cache_and_reported(served):
    system = {"role": "system", "content": "You are a helpful assistant. " * 6}
    first = served.client.chat.completions.create(
        model="chat", messages=[system, {"role": "user", "content": "to be"}], max_tokens=3,
        temperature=0,
    )  # fmt: skip
    again = served.client.chat.completions.create(
        model="chat", messages=[system, {"role": "user", "content": "or not"}], max_tokens=3,
        temperature=0,
    )  # fmt: skip
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 and cached % 16 == 0 and cached < again.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < cached
    reply = served.lm.generate([system, {"role": "user", "content": "or not"}], max_new_tokens=3)
    assert again.choices[0].message.content == reply  # the ids of an uncached run
    metrics = httpx.get(f"{served.url}/metrics").text
    hits = [line for line in metrics.splitlines()
            if line.startswith('keras_attn_prefix_cache_hit_tokens{model="chat"}')]  # fmt: skip
    assert hits and float(hits[0].split()[-1]) >= cached
