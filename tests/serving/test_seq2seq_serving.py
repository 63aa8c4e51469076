"""An encoder-decoder exported and served: `encode.onnx` once per request, `decode.onnx` steps
over both caches; `/generate` and `/generate_stream` answer with the ids and text Keras
`generate` makes from the same source text (BART, Marian and T5 folders written by
`transformers`, with their tokenizers)."""

import json

import httpx
import pytest
from keras_attn_serving.server import ModelRepository, create_app

from keras_attn.models import Seq2SeqLM
from tests.serving.test_server import serve_in_thread

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from tests.models.test_seq2seq_text import FAMILIES, TEXTS  # noqa: E402

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]
REPOSITORIES: dict = {}  # each family's served repository, to look at its decode loop


# t5_spiece exports as t5 does (its spiece.model becomes the same tokenizer.json).
@pytest.fixture(scope="module", params=["bart", "marian", "t5"])
def served(request, tmp_path_factory):
    from keras_attn_export import export_model

    make_tokenizer, make_model = FAMILIES[request.param]
    torch.manual_seed(1)
    if request.param == "marian":  # Marian's pair: source.spm, target.spm, vocab.json
        tokenizer, _ = make_tokenizer(tmp_path_factory)
    else:
        tokenizer = make_tokenizer()
    model = make_model(len(tokenizer)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" not in name:  # Marian's sinusoids are fixed, not loaded
                parameter.mul_(2.0)
        if request.param == "bart":  # else these random weights end at once
            model.final_logits_bias[0, model.config.eos_token_id] -= 3.0
    if request.param == "bart":  # as bart-large-cnn's folders: the first new id is <s>
        model.generation_config.forced_bos_token_id = 0
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    lm = Seq2SeqLM.from_pretrained(folder / "hf", dropout=0.0)
    # These random T5 weights reach logits of about 77, where float32 sums of another order
    # differ by 2e-3: the tolerance is 6e-5 of that scale.
    tolerance = 5e-3 if request.param == "t5" else 1e-4
    manifest = export_model(
        lm, folder / "repository" / "s2s" / "1", formats=("onnx",), batch_sizes=(1, 2),
        sequence_lengths=(4, 9), tolerance=tolerance, strings_in=True,
    )  # fmt: skip
    repository = ModelRepository(folder / "repository")
    REPOSITORIES[request.param] = repository
    url, stop = serve_in_thread(create_app(repository))
    yield request.param, lm, manifest, url, folder / "repository" / "s2s" / "1"
    stop()


def test_the_artifact_has_both_graphs_checked(served):
    name, lm, manifest, _, _ = served
    graphs = manifest.seq2seq
    assert (graphs.encoder_file, graphs.file) == ("encode.onnx", "decode.onnx")
    assert graphs.greedy_equals_keras and graphs.step_logits_max_abs_diff <= 5e-3
    assert graphs.decoder_start_id == lm.decoder_start_token_id
    assert graphs.never_generated_id is None  # the families may generate their padding id
    # BART's and Marian's checkpoints force their end id on the last step; T5's do not.
    assert graphs.forced_eos_token_id == lm.forced_eos_token_id
    assert (lm.forced_eos_token_id is None) == (name == "t5")
    assert graphs.forced_bos_token_id == lm.forced_bos_token_id == (0 if name == "bart" else None)
    assert {"encode.onnx", "decode.onnx"} <= set(manifest.files)


@pytest.mark.parametrize(
    "field",
    ["forced_eos_token_id", "forced_bos_token_id", "never_generated_id", "decoder_start_id"],
)
@pytest.mark.parametrize("value", [-1, 10**9])
def test_manifest_ids_outside_the_vocabulary_are_refused(served, field, value):
    from keras_attn_serving.manifest import ArtifactError
    from keras_attn_serving.seq2seq import EncoderDecoder

    _, _, manifest, _, artifact = served
    spec = {**manifest.seq2seq.model_dump(), field: value}
    with pytest.raises(ArtifactError, match=f"seq2seq.{field}' is {value}: not an id"):
        EncoderDecoder(artifact, spec)


def test_generate_and_stream_equal_keras(served):
    name, lm, _, url, _ = served
    reached_the_limit, lengths = 0, []  # rows whose end id was forced on the last step
    for text in TEXTS[:4]:
        body = {"text_input": text, "parameters": {"max_tokens": 8}}
        answer = httpx.post(f"{url}/v2/models/s2s/generate", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        packed = lm.preprocessor([text])["encoder_token_ids"].numpy()[0].tolist()
        source = [t for t in packed if t != lm.pad_token_id]
        stop = lm.preprocessor.end_token_ids
        expected_ids = lm.generate([source], 8, stop_token_ids=stop)[0]
        assert answer.json()["token_ids"] == expected_ids, (name, text)
        assert (expected_ids[0] == 0) == (name == "bart"), (name, expected_ids)
        free = lm.generate([source], 8, stop_token_ids=stop, forced_eos_token_id=None)[0]
        reached_the_limit += len(free) == 8 and expected_ids == free[:7]
        lengths.append(len(expected_ids))
        assert answer.json()["text_output"] == lm.generate(text, 8), (name, text)
        with httpx.stream("POST", f"{url}/v2/models/s2s/generate_stream", json=body,
                          timeout=60) as stream:  # fmt: skip
            events = [json.loads(line[5:]) for line in stream.iter_lines() if line]
        assert [e["token_id"] for e in events] == expected_ids
        assert "".join(e["text_output"] for e in events) == answer.json()["text_output"]
    assert reached_the_limit or name == "t5", (name, lengths)
    assert any(lengths), name  # ids that could differ


def test_concurrent_streams_share_steps_and_equal_keras(served, monkeypatch):
    """Six `/generate_stream` requests at once, sources of different lengths: the server's
    decode loop steps them together (iteration-level batching), and each gets the ids and
    text Keras `generate` makes from its source alone, forcing included."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    name, lm, _, url, _ = served
    warm = {"text_input": TEXTS[0], "parameters": {"max_tokens": 1}}  # loads the model here
    assert httpx.post(f"{url}/v2/models/s2s/generate", json=warm, timeout=60).status_code == 200
    ((_, _, predictor, _),) = REPOSITORIES[name].loaded()
    graphs, run_decoder = predictor.encoder_decoder, predictor.encoder_decoder.run_decoder

    def slowed(*args):  # 20 ms a step: streams sent together overlap, on any machine
        time.sleep(0.02)
        return run_decoder(*args)

    monkeypatch.setattr(graphs, "run_decoder", slowed)
    texts = [TEXTS[k % len(TEXTS)][: 8 + 9 * k] for k in range(6)]

    def streamed(text):
        body = {"text_input": text, "parameters": {"max_tokens": 10}}
        with httpx.stream("POST", f"{url}/v2/models/s2s/generate_stream", json=body,
                          timeout=120) as stream:  # fmt: skip
            return [json.loads(line[5:]) for line in stream.iter_lines() if line]

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(streamed, texts))
    for text, events in zip(texts, answers, strict=True):
        expected = lm.generate(text, 10)
        assert "".join(e["text_output"] for e in events) == expected, (name, text)
    loop = predictor.decode_batcher
    assert loop is not None and type(loop).__name__ == "Seq2SeqBatcher"
    assert loop.peak_rows > 1 and loop.rows_stepped > loop.steps, name


@pytest.mark.parametrize(
    "settings",
    [{"num_beams": 3}, {"num_beams": 2, "length_penalty": 2.0, "no_repeat_ngram_size": 2}],
)
def test_beam_search_equals_keras(served, settings):
    name, lm, _, url, _ = served
    for text in TEXTS[:3]:
        body = {"text_input": text, "parameters": {"max_tokens": 8, **settings}}
        answer = httpx.post(f"{url}/v2/models/s2s/generate", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        expected = lm.generate(text, 8, sampler="beam", **settings)
        assert answer.json()["text_output"] == expected, (name, text, settings)


def test_the_decode_graph_steps_rows_at_their_own_positions(served):
    """`decode.onnx` takes one position per row: rows 2 and 4 long step together, each
    writing its own cache place and reading its own prefix; logits equal the Keras model's
    full forward at each row's position (iteration-level batching's graph)."""
    import numpy as np
    from keras_attn_serving.seq2seq import EncoderDecoder

    name, lm, manifest, _, artifact = served
    graphs = EncoderDecoder(artifact, manifest.seq2seq.model_dump())
    assert graphs.per_row_index
    packed = lm.preprocessor(TEXTS[:2])["encoder_token_ids"].numpy()
    sources = [[t for t in row.tolist() if t != lm.pad_token_id] for row in packed]
    padded = np.full((2, max(map(len, sources))), lm.pad_token_id, np.int32)
    for row, ids in enumerate(sources):
        padded[row, : len(ids)] = ids
    target = np.random.default_rng(0).integers(3, 40, size=(2, 6)).astype(np.int32)
    target[:, 0] = lm.decoder_start_token_id
    inputs = {"encoder_token_ids": padded, "decoder_token_ids": target}
    full = lm(inputs, training=False).numpy()
    prefill = target[:, :4].copy()
    prefill[0, 2:] = 7  # row 0 is 2 long: its own steps overwrite these places
    _, state = graphs.step(prefill, graphs.start(sources), 0)
    lengths = np.array([2, 4])
    worst = 0.0
    for step in range(2):
        index = lengths + step
        logits, state = graphs.step(target[[0, 1], index][:, None], state, index)
        worst = max(worst, float(np.abs(logits - full[[0, 1], index]).max()))
    assert worst <= max(1e-4, manifest.seq2seq.step_logits_max_abs_diff * 4), (name, worst)


def test_a_decode_graph_of_one_position_for_all_rows_still_generates(served, tmp_path):
    """Graphs written before format 5 take a scalar `index`: the server still runs them."""
    import shutil

    from keras_attn_export.seq2seq import write_seq2seq_onnx
    from keras_attn_serving.generation import decode_ids
    from keras_attn_serving.seq2seq import EncoderDecoder

    name, lm, manifest, _, artifact = served
    if name != "bart":
        pytest.skip("one family is enough: the server's side is the same for all")
    old = tmp_path / "old"
    shutil.copytree(artifact, old)
    write_seq2seq_onnx(lm, old, per_row_index=False)
    graphs = EncoderDecoder(old, manifest.seq2seq.model_dump())
    assert not graphs.per_row_index
    packed = lm.preprocessor(TEXTS[:2])["encoder_token_ids"].numpy()
    sources = [[t for t in row.tolist() if t != lm.pad_token_id] for row in packed]
    ids = decode_ids(graphs.step, graphs.start(sources), [[graphs.start_id]] * 2, 6,
                     pad_token_id=graphs.never_generated_id, max_length=graphs.max_length,
                     forced_eos_token_id=graphs.forced_eos_token_id,
                     forced_bos_token_id=graphs.forced_bos_token_id)  # fmt: skip
    assert ids == lm.generate(sources, 6)
    with pytest.raises(ValueError, match="one position for all rows"):
        graphs.step([[5], [6]], graphs.start(sources), [1, 2])


def test_a_source_longer_than_the_encoder_takes_is_refused(served):
    _, _, manifest, url, _ = served
    if manifest.max_sequence_length is None:
        pytest.skip("relative positions: the encoder takes any length")
    body = {"text_input": "hello " * 400, "parameters": {"max_tokens": 4}}
    answer = httpx.post(f"{url}/v2/models/s2s/generate", json=body, timeout=60)
    assert answer.status_code == 400
    assert "tokens" in answer.json()["error"]


def test_openai_completions_generate_from_the_source(served):
    """`/v1/completions`: the prompt is the source text; temperature 0 is Keras greedy. The
    chat route needs a chat template, which no encoder-decoder here has: a 400 naming it."""
    name, lm, _, url, _ = served
    text = TEXTS[0]
    body = {"model": "s2s", "prompt": text, "max_tokens": 8, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == lm.generate(text, 8), name
    chat = {"model": "s2s", "messages": [{"role": "user", "content": text}]}
    refused = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
    assert refused.status_code == 400 and "chat template" in refused.text


def test_an_artifact_of_format_4_generates_as_one_of_format_5(served, tmp_path):
    """The padding names before format 5 (`source_pad_id`, `pad_id`) are read as
    `pad_token_id` and `never_generated_id`: the same ids from the same graphs."""
    import shutil

    from keras_attn_serving import Predictor

    name, lm, _, _, artifact = served
    old = tmp_path / "format4"
    shutil.copytree(artifact, old)
    content = json.loads((old / "manifest.json").read_text())
    seq2seq = content["seq2seq"]
    seq2seq["source_pad_id"] = seq2seq.pop("pad_token_id")
    seq2seq["pad_id"] = seq2seq.pop("never_generated_id")
    content["format_version"] = 4
    (old / "manifest.json").write_text(json.dumps(content))
    source = [t for t in lm.preprocessor([TEXTS[0]])["encoder_token_ids"].numpy()[0].tolist()
              if t != lm.pad_token_id]  # fmt: skip
    expected = lm.generate([source, source[:3]], 6)
    assert Predictor(old).generate_ids([source, source[:3]], 6) == expected, name
    assert Predictor(artifact).generate_ids([source, source[:3]], 6) == expected, name


def test_the_strings_in_encoder_generates_as_keras(served):
    """`strings_in=True`: `encode.text.onnx` (the tokenizer's onnxruntime-extensions operator:
    SentencePiece for T5 and Marian, GPT-2's BPE for BART; the packing; then `encode.onnx`)
    gives the preprocessor's source ids and `encode.onnx`'s cache, and greedy `decode.onnx`
    steps from them write Keras `generate`'s ids for the same text. It runs in a process
    without TensorFlow (`text_outputs`): the operator crashes where TensorFlow came first."""
    import numpy as np
    from keras_attn_export.text_onnx import text_outputs
    from keras_attn_serving.generation import decode_ids
    from keras_attn_serving.seq2seq import EncoderDecoder

    name, lm, manifest, _, artifact = served
    assert manifest.text_onnx.file == "encode.text.onnx" and manifest.text_onnx.input == "text"
    assert "encode.text.onnx" in manifest.files
    graphs = EncoderDecoder(artifact, manifest.seq2seq.model_dump())
    spec = manifest.seq2seq
    texts = [t for t in TEXTS if t.isascii()][:4]
    generated = []
    for text, (ids, cross) in zip(texts, text_outputs(artifact / "encode.text.onnx", texts),
                                  strict=True):  # fmt: skip
        packed_ids = np.asarray(lm.preprocessor([text])["encoder_token_ids"])[0].tolist()
        assert ids[0].tolist() == packed_ids[: len(ids[0])], (name, text)
        assert set(packed_ids[len(ids[0]) :]) <= {lm.pad_token_id}
        cache = np.zeros((1, spec.layers, 2, spec.max_length, spec.kv_heads, spec.key_dim),
                         np.float32)  # fmt: skip
        state = {"cache": cache, "cross_cache": cross, "sources": ids}
        new = decode_ids(graphs.step, state, [[graphs.start_id]], 8,
                         pad_token_id=graphs.never_generated_id, max_length=graphs.max_length,
                         forced_eos_token_id=graphs.forced_eos_token_id,
                         forced_bos_token_id=graphs.forced_bos_token_id)[0]  # fmt: skip
        assert new == lm.generate([ids[0].tolist()], 8)[0], (name, text)
        generated.append(new)
    assert any(generated), name
