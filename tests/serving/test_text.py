"""Text endpoints over real HTTP: classify, tag, embed, generate and generate_stream, each
checked against the Keras model fed by our tf-text tokenizer and packer."""

import json
import shutil
import threading
import time
from types import SimpleNamespace

import httpx
import keras
import numpy as np
import pytest
from keras_attn_serving.protocol import ServingError
from keras_attn_serving.server import ModelRepository, create_app
from keras_attn_serving.text import TextModel, softmax

from keras_attn.models import generate
from tests.conftest import TOY_TEXT, keras_greedy
from tests.serving.test_server import serve_in_thread

pytestmark = pytest.mark.tf_only  # the fixtures train and export with TensorFlow

TEXTS = ["to be or not to be", "the slings and arrows of outrageous fortune", "sleep"]
LABELS = ["negative", "neutral", "positive"]


def packer_for(tokenizer):
    from keras_attn.preprocessing import StartEndPacker

    cls, sep = (tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]"))
    return StartEndPacker(24, start_value=cls, end_value=sep)


def keras_ids(tokenizer, texts):
    """Our tf-text tokenizer and packer, trimmed to the longest row (the server pads there)."""
    ids = keras.ops.convert_to_numpy(packer_for(tokenizer)(tokenizer.tokenize(texts)))
    return ids[:, : int((ids != 0).sum(1).max())]


def run(model, ids):
    """A Keras model of the encoder family on ids (one segment), as NumPy."""
    out = model({"token_ids": ids, "segment_ids": np.zeros_like(ids)})
    if isinstance(out, dict):
        return {k: keras.ops.convert_to_numpy(v) for k, v in out.items()}
    return keras.ops.convert_to_numpy(out)


@pytest.fixture(scope="module")
def text_models(toy_tokenizer, toy_artifact, tmp_path_factory):
    from keras_attn_export import export_model

    from keras_attn.models import Encoder, SequenceClassifier, TokenClassifier

    keras.utils.set_random_seed(0)
    vocabulary = toy_tokenizer.vocabulary_size()
    encoder = Encoder(vocabulary, 24, hidden_dim=16, num_layers=1, num_heads=2)
    models = {
        "sentiment": (SequenceClassifier(encoder, 3, pooling="mean", dropout=0.0), LABELS),
        "tagger": (TokenClassifier(encoder, 2, dropout=0.0), ["O", "NAME"]),
        "encoder": (encoder, None),
    }
    root = tmp_path_factory.mktemp("text_repository")
    manifests = {}
    for name, (model, labels) in models.items():
        manifests[name] = export_model(
            model, root / name / "1", tokenizer=toy_tokenizer, packer=packer_for(toy_tokenizer),
            formats=["onnx"], labels=labels, verbose=False,
        )  # fmt: skip
    shutil.copytree(toy_artifact[0], root / "lm" / "1")
    url, stop = serve_in_thread(create_app(ModelRepository(root)))
    yield url, {name: model for name, (model, _) in models.items()}, manifests
    stop()


def post(url, path, body):
    return httpx.post(f"{url}/v2/models/{path}", json=body, timeout=60)


def test_manifest_names_the_task_labels_and_packer(text_models):
    _, _, manifests = text_models
    assert {n: m["task"] for n, m in manifests.items()} == {
        "sentiment": "classify", "tagger": "tag", "encoder": "embed"}  # fmt: skip
    assert manifests["sentiment"]["labels"] == LABELS and manifests["encoder"]["labels"] is None
    assert manifests["tagger"].packer.model_dump() == {
        "type": "start_end", "sequence_length": 24, "start_value": 2, "end_value": 3,
        "pad_value": 0, "truncate": None}  # fmt: skip


def test_classify_equals_keras_softmax(text_models, toy_tokenizer):
    url, models, _ = text_models
    response = post(url, "sentiment/classify", {"text_input": TEXTS})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    expected = softmax(run(models["sentiment"], keras_ids(toy_tokenizer, TEXTS)))
    got = np.array([[p["scores"][label] for label in LABELS] for p in predictions])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [p["label"] for p in predictions] == [LABELS[i] for i in expected.argmax(1)]
    assert [p["label_id"] for p in predictions] == expected.argmax(1).tolist()
    # One string in, a list of one answer out; the version can be named.
    single = post(url, "sentiment/versions/1/classify", {"text_input": TEXTS[0]}).json()
    assert single["model_version"] == "1" and len(single["predictions"]) == 1
    assert single["predictions"][0]["score"] == pytest.approx(expected[0].max(), abs=1e-5)


def test_tag_labels_every_word_piece_without_the_special_ids(text_models, toy_tokenizer):
    url, models, _ = text_models
    response = post(url, "tagger/tag", {"text_input": TEXTS})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    ids = keras_ids(toy_tokenizer, TEXTS)
    logits = run(models["tagger"], ids)
    for row, tokens in enumerate(predictions):
        length = int((ids[row] != 0).sum())
        pieces = [toy_tokenizer.id_to_token(int(i)) for i in ids[row, 1 : length - 1]]
        assert [t["token"] for t in tokens] == pieces
        best = logits[row, 1 : length - 1].argmax(-1)
        assert [t["label"] for t in tokens] == [["O", "NAME"][i] for i in best]
        scores = softmax(logits[row, 1 : length - 1]).max(-1)
        np.testing.assert_allclose([t["score"] for t in tokens], scores, atol=1e-5)


def test_embed_mean_and_cls_pooling_equal_keras(text_models, toy_tokenizer):
    url, models, _ = text_models
    ids = keras_ids(toy_tokenizer, TEXTS)
    outputs = run(models["encoder"], ids)
    real = (ids != 0)[..., None]
    mean = (outputs["sequence_output"] * real).sum(1) / real.sum(1)
    got = post(url, "encoder/embed", {"text_input": TEXTS}).json()["embeddings"]
    np.testing.assert_allclose(got, mean, atol=1e-5)
    body = {"text_input": TEXTS, "parameters": {"pooling": "cls", "normalize": True}}
    got = np.array(post(url, "encoder/embed", body).json()["embeddings"])
    cls = outputs["pooled_output"] / np.linalg.norm(outputs["pooled_output"], axis=-1,
                                                     keepdims=True)  # fmt: skip
    np.testing.assert_allclose(got, cls, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)


def test_generate_equals_keras_greedy_and_the_stream_joins_into_it(text_models, toy_lm,
                                                                    toy_tokenizer):  # fmt: skip
    url, _, _ = text_models
    prompt = "to be or not"
    body = {"text_input": prompt, "parameters": {"max_tokens": 8}}
    answer = post(url, "lm/generate", body).json()
    assert "token_ids" in answer, answer
    prompt_ids = keras.ops.convert_to_numpy(toy_tokenizer.tokenize(prompt)).tolist()
    assert answer["token_ids"] == keras_greedy(toy_lm, prompt_ids, 8)
    full = keras.ops.convert_to_numpy(toy_tokenizer.detokenize(prompt_ids + answer["token_ids"]))
    assert f"{prompt} {answer['text_output']}".split() == full.item().decode().split()

    with httpx.stream("POST", f"{url}/v2/models/lm/generate_stream", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                  if line.startswith("data: ")]  # fmt: skip
    assert [e["token_id"] for e in events] == answer["token_ids"]
    assert "".join(e["text_output"] for e in events) == answer["text_output"]
    # One stop-id contract: a stop id ends generation and is not returned, over HTTP, in the
    # stream and in Keras `generate`.
    stop = answer["token_ids"][2]
    body["parameters"]["stop_token_ids"] = [stop]
    stopped = post(url, "lm/generate", body).json()["token_ids"]
    assert stopped == answer["token_ids"][: answer["token_ids"].index(stop)]
    (in_keras,) = generate(toy_lm, [prompt_ids], 8, stop_token_ids=[stop])
    assert stopped == in_keras
    with httpx.stream("POST", f"{url}/v2/models/lm/generate_stream", json=body) as response:
        streamed = [json.loads(line[len("data: "):])["token_id"] for line in response.iter_lines()
                    if line.startswith("data: ")]  # fmt: skip
    assert streamed == stopped


def test_sampled_generation_equals_keras_with_the_same_seed(text_models, toy_lm,
                                                            toy_tokenizer):  # fmt: skip
    """temperature, top_k, top_p and seed over HTTP draw the ids Keras `generate` draws with
    the same seed (one sampler module, one draw per step); the stream joins into them."""
    url, _, _ = text_models
    prompt = "to be or not"
    prompt_ids = keras.ops.convert_to_numpy(toy_tokenizer.tokenize(prompt)).tolist()
    settings = [
        {"temperature": 1.5, "seed": 7},
        {"temperature": 0.9, "top_k": 5, "seed": 11},
        {"top_p": 0.8, "seed": 3},
        {"temperature": 2.0, "top_k": 20, "top_p": 0.95, "seed": 2**40},
    ]
    seen = set()
    for parameters in settings:
        body = {"text_input": prompt, "parameters": {**parameters, "max_new_tokens": 8}}
        answer = post(url, "lm/generate", body).json()
        (in_keras,) = generate(toy_lm, [prompt_ids], 8, sampler="sample", **parameters)
        assert answer["token_ids"] == in_keras, parameters
        assert post(url, "lm/generate", body).json()["token_ids"] == in_keras  # same seed
        with httpx.stream("POST", f"{url}/v2/models/lm/generate_stream", json=body) as response:
            events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                      if line.startswith("data: ")]  # fmt: skip
        assert [e["token_id"] for e in events] == in_keras
        assert "".join(e["text_output"] for e in events) == answer["text_output"]
        seen.add(tuple(in_keras))
    assert len(seen) > 1  # the settings draw different continuations: sampling is on


def test_beam_search_over_http_equals_keras(text_models, toy_lm, toy_tokenizer):
    """`num_beams` and its settings over HTTP give Keras `generate(sampler="beam")`'s ids:
    one implementation (`keras_attn_serving.beam`) over the exported `decode_gqa.onnx`, the
    live beams' cache rows gathered each step."""
    url, _, _ = text_models
    prompt = "to be or not"
    prompt_ids = keras.ops.convert_to_numpy(toy_tokenizer.tokenize(prompt)).tolist()
    settings = [
        {"num_beams": 3},
        {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True},
        {"num_beams": 2, "no_repeat_ngram_size": 2, "early_stopping": "never"},
    ]
    for parameters in settings:
        body = {"text_input": prompt, "parameters": {**parameters, "max_new_tokens": 8}}
        answer = post(url, "lm/generate", body).json()
        (in_keras,) = generate(toy_lm, [prompt_ids], 8, sampler="beam", **parameters)
        assert answer["token_ids"] == in_keras, parameters
        with httpx.stream("POST", f"{url}/v2/models/lm/generate_stream", json=body) as response:
            events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                      if line.startswith("data: ")]  # fmt: skip
        assert [e["token_id"] for e in events] == in_keras


def test_stop_strings_cut_the_text_over_http_and_in_keras(text_models, toy_lm,
                                                         toy_tokenizer):  # fmt: skip
    url, _, _ = text_models
    body = {"text_input": "to be", "parameters": {"max_new_tokens": 10}}
    full = post(url, "lm/generate", body).json()
    text = full["text_output"]
    assert len(text) >= 6, full
    stop = text[3:5]  # two characters from inside the continuation
    cut = text[: text.find(stop)]
    body["parameters"]["stop"] = ["zzz-never", stop]
    answer = post(url, "lm/generate", body).json()
    assert answer["text_output"] == cut
    assert answer["token_ids"] == full["token_ids"][: len(answer["token_ids"])]
    assert len(answer["token_ids"]) < len(full["token_ids"])  # stopped early
    with httpx.stream("POST", f"{url}/v2/models/lm/generate_stream", json=body) as response:
        events = [json.loads(line[len("data: "):]) for line in response.iter_lines()
                  if line.startswith("data: ")]  # fmt: skip
    assert "".join(e["text_output"] for e in events) == cut
    assert all(stop not in e["text_output"] for e in events)  # held back, never sent
    assert [e["token_id"] for e in events] == answer["token_ids"]


def test_concurrent_generations_keep_their_own_caches(text_models, toy_lm, toy_tokenizer):
    # Requests side by side share decode steps (iteration-level batching: each row at its
    # own position of one cache): each answer equals Keras for its prompt alone, greedy or
    # sampled with its own seed.
    from concurrent.futures import ThreadPoolExecutor

    url, _, _ = text_models
    prompts = ["to be", "or not to", "that is the", "be or", "the question", "not", "is", "to"]
    jobs = [(p, {"max_tokens": 10}) for p in prompts]
    jobs += [(p, {"max_tokens": 7 + i % 4, "temperature": 1.3, "seed": i})
             for i, p in enumerate(prompts)]  # fmt: skip
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda job: post(url, "lm/generate", {
            "text_input": job[0], "parameters": job[1]}).json(), jobs))  # fmt: skip
    for (prompt, parameters), answer in zip(jobs, answers, strict=True):
        prompt_ids = keras.ops.convert_to_numpy(toy_tokenizer.tokenize(prompt)).tolist()
        new = parameters["max_tokens"]
        if "seed" in parameters:
            (expected,) = generate(toy_lm, [prompt_ids], new, sampler="sample",
                                   temperature=1.3, seed=parameters["seed"])  # fmt: skip
        else:
            expected = keras_greedy(toy_lm, prompt_ids, new)
        assert answer["token_ids"] == expected, (prompt, parameters)


@pytest.mark.parametrize(
    "path, body, status, words",
    [
        ("lm/classify", {"text_input": "to be"}, 400, "task is 'generate'"),
        ("sentiment/generate", {"text_input": "to be"}, 400, "task is 'classify'"),
        ("sentiment/classify", {"text": "to be"}, 400, "text_input"),
        ("sentiment/classify", {"text_input": []}, 400, "non-empty list"),
        ("sentiment/classify", {"text_input": [1, 2]}, 400, "text_input"),
        ("encoder/embed", {"text_input": "a", "parameters": {"pooling": "max"}}, 400, "pooling"),
        ("encoder/embed", {"text_input": "a", "parameters": {"normalize": "yes"}}, 400,
         "normalize"),
        ("encoder/embed", {"text_input": "a", "parameters": [1]}, 400, "parameters"),
        ("lm/generate", {"text_input": ["a", "b"]}, 400, "one string"),
        ("lm/generate", {"text_input": "to be", "parameters": {"max_tokens": 0}}, 400,
         "max_tokens"),
        ("lm/generate", {"text_input": "to be", "parameters": {"max_tokens": 500}}, 400,
         "maximum sequence length 24"),
        ("lm/generate", {"text_input": " ".join(TOY_TEXT[:3])}, 400,
         "the model takes at most 24 positions"),
        ("lm/generate", {"text_input": "a", "parameters": {"stop_token_ids": "x"}}, 400,
         "stop_token_ids"),
        ("lm/generate", {"text_input": "a", "parameters": {"stop_token_ids": [10**30]}}, 400,
         "stop_token_ids` must be a list of ids in [0, "),
        ("lm/generate", {"text_input": "a", "parameters": {"stop_token_ids": [1e30]}}, 400,
         "stop_token_ids"),
        # Sampling parameters: every bad value named (issue 27).
        ("lm/generate", {"text_input": "a", "parameters": {"temperature": -1}}, 400,
         "`temperature` must be a finite number >= 0 (0: greedy); received -1"),
        ("lm/generate", {"text_input": "a", "parameters": {"temperature": True}}, 400,
         "`temperature` must be a finite number >= 0"),
        ("lm/generate", {"text_input": "a", "parameters": {"top_k": 0}}, 400,
         "`top_k` must be an integer >= 1"),
        ("lm/generate", {"text_input": "a", "parameters": {"top_k": 2.5}}, 400, "top_k"),
        ("lm/generate", {"text_input": "a", "parameters": {"top_p": 1.5}}, 400,
         "`top_p` must be a number in (0, 1]"),
        ("lm/generate", {"text_input": "a", "parameters": {"seed": -1}}, 400,
         "`seed` must be an integer in [0, 2**63)"),
        ("lm/generate", {"text_input": "a", "parameters": {"seed": "x"}}, 400, "seed"),
        ("lm/generate", {"text_input": "a", "parameters": {"stop": [""]}}, 400, "`stop`"),
        ("lm/generate", {"text_input": "a", "parameters": {"stop": ["x"] * 17}}, 400,
         "at most 16"),
        ("lm/generate", {"text_input": "a", "parameters": {"stop": [10**9]}}, 400, "`stop`"),
        ("lm/generate", {"text_input": "a", "parameters": {"num_beams": 9}}, 400,
         "`num_beams` must be an integer in [1, 8]"),
        ("lm/generate", {"text_input": "a", "parameters": {"num_beams": "3"}}, 400,
         "num_beams"),
        ("lm/generate", {"text_input": "a", "parameters": {"early_stopping": "soon"}}, 400,
         "`early_stopping` must be true, false or \"never\""),
        ("lm/generate", {"text_input": "a", "parameters": {"no_repeat_ngram_size": 99}}, 400,
         "no_repeat_ngram_size"),
        ("lm/generate", {"text_input": "a", "parameters": {"length_penalty": 1e9}}, 400,
         "length_penalty"),
        ("lm/generate", {"text_input": "a", "parameters": {"num_beams": 2, "seed": 1}}, 400,
         "beam search does not sample"),
        ("lm/generate", {"text_input": "a", "parameters": {"max_tokens": 3,
                                                            "max_new_tokens": 3}}, 400,
         "not both"),
        ("lm/generate", {"text_input": "a", "parameters": {"max_new_tokens": -2}}, 400,
         "`max_new_tokens` must be an integer >= 1"),
        # Never silently ignored: typos and extras.
        ("lm/generate", {"text_input": "a", "parameters": {"max_token": 3}}, 400,
         "['max_token']"),
        ("sentiment/classify", {"text_input": "a", "parameters": {"top_k": 2}}, 400,
         "supported: none"),
        ("encoder/embed", {"text_input": "a", "parameters": {"pool": "cls"}}, 400,
         "supported: normalize, pooling"),
        ("nope/classify", {"text_input": "a"}, 404, "nope"),
        # A top-level option was ignored (20 tokens came back for `max_tokens: 5`).
        ("lm/generate", {"text_input": "a", "max_tokens": 5}, 400,
         "unknown fields ['max_tokens'] in the body: it takes `text_input` and `parameters` "
         "(per-request options go inside `parameters`)"),
        ("sentiment/classify", {"text_input": "a", "labels": 2}, 400, "unknown fields"),
    ],
)  # fmt: skip
def test_text_errors_name_the_problem(text_models, path, body, status, words):
    url, _, _ = text_models
    response = post(url, path, body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]


def test_long_texts_are_truncated_as_the_packer_truncates(text_models, toy_tokenizer):
    url, models, _ = text_models
    long_text = " ".join(TOY_TEXT[:4])  # more than 24 pieces
    got = post(url, "sentiment/classify", {"text_input": long_text}).json()["predictions"]
    ids = keras.ops.convert_to_numpy(packer_for(toy_tokenizer)(toy_tokenizer.tokenize([long_text])))
    assert (ids != 0).sum() == 24
    expected = softmax(run(models["sentiment"], ids))[0]
    np.testing.assert_allclose([got[0]["scores"][x] for x in LABELS], expected, atol=1e-5)


def test_a_model_without_a_tokenizer_has_no_text_endpoints():
    manifest = SimpleNamespace(task="classify", labels=None, packer=None, inputs=[])
    predictor = SimpleNamespace(manifest=manifest, inputs={}, tokenizer=None)
    with pytest.raises(ServingError, match="without a tokenizer"):
        TextModel(predictor).require("classify")


def test_export_checks_labels(toy_lm, tmp_path):
    from keras_attn_export import export_model

    from keras_attn.models import Encoder, SequenceClassifier

    classifier = SequenceClassifier(Encoder(50, 8, hidden_dim=8, num_layers=1, num_heads=2), 3)
    with pytest.raises(ValueError, match="`labels` must be 3 strings"):
        export_model(classifier, tmp_path / "a", labels=["a", "b"])
    with pytest.raises(ValueError, match="Received labels for a CausalLM"):
        export_model(toy_lm, tmp_path / "b", labels=["a"])
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_heads_record_their_nested_encoder_limits(text_models, toy_tokenizer):
    """A head's position table sits in its nested encoder: the manifest still records it, so
    a sequence past it is a 400 naming the limit (issue 19: null, then a 500)."""
    url, _, manifests = text_models
    for name in ("sentiment", "tagger", "encoder"):
        assert manifests[name]["max_sequence_length"] == 24, name
        assert manifests[name]["vocabulary_size"] == toy_tokenizer.vocabulary_size(), name
    body = {"inputs": [{"name": name, "shape": [1, 30], "datatype": "INT32", "data": [1] * 30}
                       for name in ("token_ids", "segment_ids")]}  # fmt: skip
    response = httpx.post(f"{url}/v2/models/sentiment/infer", json=body, timeout=60)
    assert response.status_code == 400 and "at most 24" in response.json()["error"]


@pytest.mark.parametrize("segment", [2, -1, -2])
def test_segment_ids_outside_the_table_are_a_400(text_models, segment):
    """Issue 19: segment id 2 gave a 500, and -1, -2 silently became 1 and 0."""
    url, _, manifests = text_models
    vocabulary = manifests["sentiment"]["vocabulary_size"]
    assert manifests["sentiment"]["input_ranges"] == {
        "token_ids": (0, vocabulary), "segment_ids": (0, 2)}  # fmt: skip
    body = {"inputs": [
        {"name": "token_ids", "shape": [1, 3], "datatype": "INT32", "data": [2, 5, 3]},
        {"name": "segment_ids", "shape": [1, 3], "datatype": "INT32", "data": [0, segment, 0]},
    ]}  # fmt: skip
    response = httpx.post(f"{url}/v2/models/sentiment/infer", json=body, timeout=60)
    assert response.status_code == 400
    assert "input 'segment_ids' has values outside [0, 2)" in response.json()["error"]


def test_many_generations_share_steps_without_a_thread_each(toy_artifact, tmp_path):
    """Shared decode steps are awaited on the event loop: requests used to wait in
    `asyncio.to_thread`, whose pool has min(32, CPUs + 4) threads (6 on 2 cores), so no more
    than 6 /generate requests were ever decoded together (14 here with 8 streams)."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    shutil.copytree(toy_artifact[0], tmp_path / "lm" / "1")
    repository = ModelRepository(tmp_path, max_decode_rows=32)
    body = {"text_input": "to be", "parameters": {"max_tokens": 20}}  # the model takes 24
    with TestClient(create_app(repository)) as client:
        first = client.post("/v2/models/lm/generate", json=body)
        assert first.status_code == 200, first.text
        expected = first.json()["token_ids"]
        ((_, _, predictor, _),) = repository.loaded()
        batcher = predictor._decode_batcher
        run = batcher._run

        def slow_step(*args):  # 20 steps take >= 0.2 s: the requests surely overlap
            time.sleep(0.01)
            return run(*args)

        batcher._run = slow_step
        start = threading.Barrier(24)

        def one(route: str) -> list[int]:
            start.wait()
            answer = client.post(f"/v2/models/lm/{route}", json=body)
            assert answer.status_code == 200, answer.text
            if route == "generate":
                return answer.json()["token_ids"]
            return [json.loads(line[6:])["token_id"]
                    for line in answer.text.splitlines() if line.startswith("data: ")]  # fmt: skip

        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(one, ["generate"] * 16 + ["generate_stream"] * 8))
    assert answers == [expected] * 24
    assert batcher.peak_rows >= 20, batcher.peak_rows  # 24 arrive together; at most 14 before


def test_generate_past_the_request_timeout_is_a_504(toy_artifact, tmp_path):
    """Issue 19: /generate had no timeout (README promises 504); it now stops computing at
    the deadline, on both generate routes."""
    from fastapi.testclient import TestClient

    shutil.copytree(toy_artifact[0], tmp_path / "lm" / "1")
    body = {"text_input": "to be", "parameters": {"max_tokens": 8}}
    with TestClient(create_app(tmp_path, request_timeout_s=1e-9)) as client:
        for route in ("generate", "generate_stream"):
            answer = client.post(f"/v2/models/lm/{route}", json=body)
            assert answer.status_code == 504, answer.text
            assert answer.json() == {"error": "generation timed out after 1e-09 s"}
    with TestClient(create_app(tmp_path)) as client:
        assert len(client.post("/v2/models/lm/generate", json=body).json()["token_ids"]) == 8


def test_prompt_ids_past_the_model_vocabulary_are_a_400_and_streams_beside_go_on(
    toy_artifact, toy_tokenizer, tmp_path
):
    """Issue 41 item 1: a served tokenizer.json with 5 added tokens past the model's ids; one
    prompt with such a token used to end every stream decoding beside it (500 and error
    events). It is now a 400 naming the token, and the 8 streams beside it finish whole."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = tmp_path / "lm" / "1"
    shutil.copytree(toy_artifact[0], folder)
    vocabulary = toy_tokenizer.get_vocabulary()
    words = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocabulary)}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words.decoder = decoders.WordPiece()
    words.add_tokens([f"<extra_{i}>" for i in range(5)])
    (folder / "tokenizer" / "tokenizer.json").write_text(words.to_str())
    body = {"text_input": "to be", "parameters": {"max_tokens": 12}}
    repository = ModelRepository(tmp_path, verify=False, max_decode_rows=16)
    with TestClient(create_app(repository)) as client:
        expected = client.post("/v2/models/lm/generate", json=body).json()["text_output"]
        start = threading.Barrier(10)

        def one(i: int) -> object:
            start.wait()
            if i < 2:
                bad = {"text_input": "to be <extra_2>", "parameters": {"max_tokens": 12}}
                return client.post(f"/v2/models/lm/{['generate', 'generate_stream'][i]}",
                                   json=bad)  # fmt: skip
            answer = client.post("/v2/models/lm/generate_stream", json=body)
            events = [json.loads(line[6:]) for line in answer.text.splitlines()
                      if line.startswith("data: ")]  # fmt: skip
            return "".join(e.get("text_output", "<error>") for e in events)

        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(one, range(10)))
    for refused in answers[:2]:
        assert refused.status_code == 400, refused.text
        assert "<extra_2>" in refused.json()["error"]
        assert f"[0, {len(vocabulary)})" in refused.json()["error"]
    assert answers[2:] == [expected] * 8
