"""Fuzzing the server with hypothesis: KServe v2 JSON and binary bodies, TF Serving bodies, text
bodies, model names and versions (broken version folders included), headers. Invariants for
every request a client can send: no 5xx; every 4xx is `{"error": str}` naming no host path,
address, traceback or onnxruntime node; the server stays ready. Over the whole run: health
checks sent alongside stay fast (p99 <= 250 ms), `/metrics` counts every request and every
5xx, and the server's memory stays within 10% of what it held once warm. The server runs in
its own process (`keras-attn-serve`), over loopback.

`make test` runs a bounded, derandomized pass (~60 s); `make fuzz` runs a longer random one
(`KERAS_ATTN_FUZZ_EXAMPLES` examples per strategy) and prints the request count and statuses.
"""

import collections
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keras_attn_serving.protocol import DATATYPES, OPENAI_PATHS

from tests.serving.test_server import free_port

EXAMPLES = int(os.environ.get("KERAS_ATTN_FUZZ_EXAMPLES", "0"))
LONG = EXAMPLES > 0
FUZZ = settings(
    max_examples=EXAMPLES or 100,
    deadline=None,
    derandomize=not LONG,  # the suite is reproducible; `make fuzz` explores
    database=None,
    suppress_health_check=list(HealthCheck),
)
LEAK = re.compile(
    r"/tmp/|/work/|/root/|/home/|/usr/|site-packages|0x[0-9a-fA-F]{6,}|Traceback|File \"|"
    r"\[ONNXRuntimeError\]|onnxruntime::|<[\w.]+ object at|\bNode\b|\bnode_name\b"
)
STATUSES = collections.Counter()  # of the fuzzed requests (readiness checks not counted)
SENT = collections.Counter()  # every request this suite sends, health checks included
BROKEN = [
    "no_manifest",
    "empty",
    "tampered",
    "garbled",
    "bad_config",
    "infinite_delay",
    "huge_delay",
    "tokenizer_not_json",
    "tokenizer_bad_regex",
]  # version folders
# The server's RSS is taken as its baseline once this many fuzzed requests have warmed it
# (onnxruntime's arenas grow to the shapes served, then stay): a leak grows with the requests,
# a warm server does not (measured: +10 MB over the bounded pass's 642 requests, +12 MB over
# `make fuzz`'s 6,042).
WARM_REQUESTS = 300
RSS = {}  # server RSS: "start" (after WARM_UP), "warm" (after WARM_REQUESTS requests)


@pytest.fixture(scope="module")
def client(toy_artifact, toy_tokenizer, tmp_path_factory):
    """A server over a causal LM (`lm`, one input) and a classifier (`cls`, token and
    segment ids, a tokenizer and a packer), with small limits so limits are reached."""
    import keras
    from keras_attn_export import export_model

    from keras_attn.models import Encoder, SequenceClassifier
    from keras_attn.preprocessing import StartEndPacker

    keras.utils.set_random_seed(0)
    root = tmp_path_factory.mktemp("fuzz_repository")
    shutil.copytree(toy_artifact[0], root / "lm" / "1")
    vocabulary = toy_tokenizer.vocabulary_size()
    encoder = Encoder(vocabulary, 24, hidden_dim=16, num_layers=1, num_heads=2)
    packer = StartEndPacker(16, start_value=2, end_value=3)
    export_model(
        SequenceClassifier(encoder, 2, dropout=0.0), root / "cls" / "1", formats=["onnx"],
        tokenizer=toy_tokenizer, packer=packer, labels=["no", "yes"], verbose=False,
    )  # fmt: skip
    for name in BROKEN:
        shutil.copytree(toy_artifact[0], root / name / "1")
    (root / "no_manifest" / "1" / "manifest.json").unlink()
    shutil.rmtree(root / "empty" / "1")
    (root / "empty" / "1").mkdir()
    (root / "tampered" / "1" / "model.onnx").write_bytes(b"tampered")
    (root / "garbled" / "1" / "manifest.json").write_text("{not json")
    (root / "bad_config" / "config.json").write_text('{"max_batch_size": -1}')
    (root / "infinite_delay" / "config.json").write_text('{"max_delay_ms": Infinity}')
    (root / "huge_delay" / "config.json").write_text('{"max_delay_ms": 1e308}')
    # Operator files the manifest's hashes still vouch for: re-hashed, so the tokenizer's
    # own loading is what refuses them.
    for name, text in (("tokenizer_not_json", "{not json"), ("tokenizer_bad_regex", json.dumps(
        {"model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"},
         "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("},
                           "behavior": "Isolated", "invert": False}}))):  # fmt: skip
        tokenizer = root / name / "1" / "tokenizer" / "tokenizer.json"
        tokenizer.write_text(text)
        manifest = json.loads((root / name / "1" / "manifest.json").read_text())
        manifest["files"]["tokenizer/tokenizer.json"] = hashlib.sha256(
            tokenizer.read_bytes()
        ).hexdigest()
        (root / name / "1" / "manifest.json").write_text(json.dumps(manifest))
    # A served tokenizer with 5 tokens past the model's ids (issue 41 item 1): rehashed.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = Tokenizer(
        models.WordPiece(
            {t: i for i, t in enumerate(toy_tokenizer.get_vocabulary())}, unk_token="[UNK]"
        )
    )
    words.pre_tokenizer, words.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece()
    words.add_tokens([f"<extra_{i}>" for i in range(5)])
    shutil.copytree(toy_artifact[0], root / "extra_tokens" / "1")
    tokenizer = root / "extra_tokens" / "1" / "tokenizer" / "tokenizer.json"
    tokenizer.write_text(words.to_str())
    manifest = json.loads((root / "extra_tokens" / "1" / "manifest.json").read_text())
    manifest["files"]["tokenizer/tokenizer.json"] = hashlib.sha256(
        tokenizer.read_bytes()
    ).hexdigest()
    (root / "extra_tokens" / "1" / "manifest.json").write_text(json.dumps(manifest))
    # A chat model (issue 42): the toy LM with a chat template and an end-of-turn id, as an
    # export writes them (rehashed).
    shutil.copytree(toy_artifact[0], root / "chat" / "1")
    template = root / "chat" / "1" / "chat_template.jinja"
    template.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant:{% endif %}")  # fmt: skip
    manifest = json.loads((root / "chat" / "1" / "manifest.json").read_text())
    manifest["chat"] = {"template": "chat_template.jinja", "special_tokens": {},
                        "end_token_ids": [3]}  # fmt: skip
    manifest["files"]["chat_template.jinja"] = hashlib.sha256(template.read_bytes()).hexdigest()
    (root / "chat" / "1" / "manifest.json").write_text(json.dumps(manifest))
    # `keras-attn-serve` in its own process, over loopback: its memory and its event loop are
    # measured apart from hypothesis's (which grows this process by ~10% in a long run).
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "keras_attn_serving", "--model-repository", str(root),
         "--port", str(port), "--max-body-bytes", str(1 << 20), "--max-rows-per-request",
         "64", "--max-output-bytes", str(4 << 20), "--request-timeout-s", "20",
         "--log-level", "warning"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # Redirects are not followed: each request the suite sends is one request served.
    client = httpx.Client(base_url=url, timeout=60, follow_redirects=False)
    try:
        for _ in range(600):
            try:
                client.get("/v2/health/live")
                SENT["request"] += 1
                break
            except httpx.TransportError:
                time.sleep(0.1)
        client.root = str(root)
        for path, body in WARM_UP:  # every route's first use, before the baseline
            client.post(path, content=dumps(body))
        SENT["request"] += len(WARM_UP)
        RSS["pid"], RSS["start"] = server.pid, server_rss(server.pid)
        health, done = [], threading.Event()
        prober = threading.Thread(target=probe_health, args=(url, health, done))
        prober.start()
        yield client
        done.set()
        prober.join()
        end = server_rss(server.pid)
        start, warm = RSS["start"], RSS.get("warm", RSS["start"])
        total = sum(STATUSES.values())
        statuses = dict(sorted(STATUSES.items()))
        p99 = float(np.percentile(health, 99)) if health else 0.0
        print(f"\nfuzz: {total} requests (each followed by a readiness check), statuses "
              f"{statuses}; health p99 {1000 * p99:.1f} ms over {len(health)} checks; server "
              f"RSS {start / 2**20:.0f} MB, {warm / 2**20:.0f} MB after {WARM_REQUESTS} "
              f"requests, {end / 2**20:.0f} MB at the end")  # fmt: skip
        counted = metric_totals(client.get("/metrics").text)
        assert counted["requests"] == sum(SENT.values()), (counted, SENT)
        assert counted["5xx"] == sum(n for status, n in STATUSES.items() if status >= 500)
        # Health is checked from this process, beside the fuzzer's own work on 2 cores: the
        # bound is looser than tests/serving/test_event_loop.py's 100 ms.
        assert p99 <= 0.25
        assert end - warm < 0.1 * warm
    finally:
        client.close()
        server.terminate()
        server.wait(30)


IDS_2X3 = {"name": "token_ids", "shape": [2, 3], "datatype": "INT32", "data": [5, 6, 7, 8, 9, 4]}
# The largest batches the fuzzer can get served: onnxruntime's memory arena grows to its peak
# shape once and keeps it, which is not a leak.
IDS_64X30 = {"name": "token_ids", "shape": [64, 30], "datatype": "INT32", "data": [5] * 1920}
WARM_UP = [
    ("/v2/models/lm/infer", {"inputs": [IDS_64X30]}),
    ("/v2/models/cls/infer", {"inputs": [IDS_64X30, dict(IDS_64X30, name="segment_ids")]}),
    ("/v2/models/cls/classify", {"text_input": ["to be or not " * 40] * 64}),
    ("/v2/models/lm/infer", {"inputs": [IDS_2X3]}),
    ("/v2/models/cls/infer", {"inputs": [IDS_2X3, dict(IDS_2X3, name="segment_ids")]}),
    ("/v2/models/cls/classify", {"text_input": ["to be", "or not"]}),
    ("/v2/models/lm/generate", {"text_input": "to be", "parameters": {"max_tokens": 18}}),
    ("/v2/models/lm/generate_stream", {"text_input": "to", "parameters": {"max_tokens": 20}}),
    ("/v1/models/lm:predict", {"instances": [[5, 6, 7] * 10] * 64}),
    ("/v2/models/nope/infer", {}),
    *[(f"/v2/models/{name}/infer", {"inputs": [IDS_2X3]}) for name in BROKEN],
]


def server_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def probe_health(url, latencies, done):
    """Liveness checks every 20 ms while the fuzzer runs, each one's latency kept."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not done.is_set():
            started = time.perf_counter()
            assert client.get("/v2/health/live").status_code == 200
            latencies.append(time.perf_counter() - started)
            SENT["health"] += 1
            time.sleep(0.02)


def metric_totals(exposition):
    """Requests answered and 5xx answers, summed over routes, from `/metrics`."""
    totals = collections.Counter()
    for line in exposition.splitlines():
        if line.startswith("keras_attn_requests_total{"):
            totals["requests"] += float(line.rsplit(" ", 1)[1])
            if re.search(r'status="5\d\d"', line):
                totals["5xx"] += float(line.rsplit(" ", 1)[1])
    return totals


def check(client, response):
    """The invariants of one answer, then readiness."""
    STATUSES[response.status_code] += 1
    SENT["request"] += 2  # it, and the readiness check below
    if sum(STATUSES.values()) == WARM_REQUESTS:
        RSS["warm"] = server_rss(RSS["pid"])
    text = response.text
    assert response.status_code < 500, (response.status_code, text[:500])
    if response.status_code >= 400:
        body = json.loads(text)
        assert isinstance(body, dict) and list(body) == ["error"], text[:500]
        message = body["error"]
        if isinstance(message, dict):  # OpenAI's shape, on its routes
            assert response.request.url.path.startswith(OPENAI_PATHS), text[:500]
            assert list(message) == ["message", "type", "param", "code"], text[:500]
            message = message["message"]
        assert isinstance(message, str) and message, text[:500]
        assert not LEAK.search(message) and client.root not in message, body
    assert client.get("/v2/health/ready").status_code == 200


# --- strategies ------------------------------------------------------------------------------
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12)
)
JSON = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                        max_size=4),
    max_leaves=16,
)  # fmt: skip
ODD_TEXT = st.lists(
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(["\ud800", "\udfff", "д" * 60, "ΟΔΟΣ", "\x00", "🙂", "日本語", "e\u0301",
                         "\ue000", "##", "[UNK]", " " * 40, "x" * 300]),
    ),
    max_size=5,
).map("".join)  # fmt: skip
NAMES = st.one_of(st.sampled_from(["token_ids", "segment_ids", "logits", "x", ""]), JSON)
DATATYPE = st.one_of(st.sampled_from([*DATATYPES, "FP8", "int32", ""]), JSON)
DIM = st.one_of(st.integers(-2, 40), st.sampled_from([2**31, 2**32, 2**63, 2**64, -(2**64)]))
SHAPE = st.one_of(st.lists(DIM, max_size=4), JSON)
IDS = st.integers(-3, 300)
DATA = st.one_of(
    st.lists(IDS, max_size=64), st.lists(st.lists(IDS, max_size=8), max_size=4),
    st.lists(LEAVES, max_size=8), JSON,
)  # fmt: skip
PARAMETERS = st.one_of(
    st.fixed_dictionaries({}, optional={
        "timeout": st.one_of(st.integers(-5, 10**7), JSON),
        "binary_data_output": JSON, "binary_data_size": JSON}),
    JSON,
)  # fmt: skip
TENSOR = st.fixed_dictionaries(
    {"name": NAMES, "shape": SHAPE, "datatype": DATATYPE},
    optional={"data": DATA, "parameters": PARAMETERS},
)


@st.composite
def near_valid_ids(draw, names=("token_ids",)):
    """Mostly-right KServe tensors: ids of a plausible shape, so the model runs too."""
    rows = draw(st.one_of(st.integers(0, 4), st.integers(60, 70)))  # the row limit is 64
    length = draw(st.integers(0, 30))
    tensors = []
    for name in names:
        ids = draw(st.sampled_from([st.integers(1, 100), st.integers(-1, 260)]))
        values = draw(st.lists(ids, min_size=rows * length, max_size=rows * length))
        shape = draw(st.one_of(st.just([rows, length]), SHAPE))
        datatype = draw(st.sampled_from(["INT32", "INT64", "INT32", "FP32", "BYTES", "BOOL"]))
        tensors.append({"name": name, "shape": shape, "datatype": datatype, "data": values})
    body = {"inputs": tensors}
    if draw(st.booleans()):
        body["outputs"] = draw(st.one_of(st.lists(st.fixed_dictionaries(
            {"name": NAMES}, optional={"parameters": PARAMETERS}), max_size=2), JSON))  # fmt: skip
    if draw(st.booleans()):
        body["parameters"] = draw(PARAMETERS)
    if draw(st.booleans()):
        body["id"] = draw(JSON)
    return body


V2_BODY = st.one_of(
    near_valid_ids(), near_valid_ids(("token_ids", "segment_ids")),
    st.fixed_dictionaries({"inputs": st.lists(TENSOR, max_size=3)},
                          optional={"outputs": JSON, "parameters": PARAMETERS, "id": JSON}),
    JSON,
)  # fmt: skip
MODEL = st.one_of(st.sampled_from(["lm", "cls", *BROKEN]), st.text(max_size=30),
                  st.just("x" * 5000))  # fmt: skip
VERSION = st.one_of(st.none(), st.sampled_from(["1", "2", "0", "²", "-1", "01", "1" * 40]),
                    st.text(max_size=8))  # fmt: skip


def model_path(model, version, action):
    base = f"/v2/models/{quote(model, safe='')}"
    if version is not None:
        base += f"/versions/{quote(version, safe='')}"
    return f"{base}/{action}"


def dumps(body):
    return json.dumps(body).encode()  # ASCII escapes: lone surrogates travel as \ud800


# --- tests -----------------------------------------------------------------------------------
@FUZZ
@given(model=MODEL, version=VERSION, body=V2_BODY)
def test_kserve_json_bodies(client, model, version, body):
    response = client.post(model_path(model, version, "infer"), content=dumps(body),
                           headers={"Content-Type": "application/json"})  # fmt: skip
    check(client, response)


@st.composite
def binary_request(draw):
    """The binary tensor extension: a JSON header, raw bytes, and a header length that is
    right, or not."""
    rows, length = draw(st.integers(0, 3)), draw(st.integers(0, 20))
    datatype = draw(st.sampled_from(["INT32", "INT64", "BYTES", "FP32", "UINT8"]))
    if datatype == "BYTES":
        items = draw(st.lists(st.binary(max_size=6), min_size=rows * length,
                              max_size=rows * length))  # fmt: skip
        raw = b"".join(struct.pack("<I", len(i)) + i for i in items)
    else:
        ids = np.array(draw(st.lists(st.integers(0, 200), min_size=rows * length,
                                     max_size=rows * length)))  # fmt: skip
        raw = ids.astype(np.dtype(DATATYPES[datatype]).newbyteorder("<")).tobytes()
    raw = draw(st.one_of(st.just(raw), st.binary(max_size=64), st.just(raw + b"\x00")))
    size = draw(st.one_of(st.just(len(raw)), st.integers(-5, 2**64), JSON))
    shape = draw(st.one_of(st.just([rows, length]), SHAPE))
    tensor = {"name": "token_ids", "shape": shape, "datatype": datatype,
              "parameters": {"binary_data_size": size}}  # fmt: skip
    header = dumps({"inputs": [tensor], "outputs": [
        {"name": "logits", "parameters": {"binary_data": draw(st.booleans())}}]})  # fmt: skip
    # What a header can hold on the wire (h11 refuses to send leading or trailing spaces).
    printable = st.characters(min_codepoint=32, max_codepoint=126)
    declared = draw(st.one_of(st.just(str(len(header))),
                              st.text(printable, max_size=6).map(str.strip),
                              st.integers(-3, 10**6).map(str)))  # fmt: skip
    return header + raw, declared


@FUZZ
@given(request=binary_request(), version=VERSION)
def test_kserve_binary_bodies(client, request, version):
    body, declared = request
    response = client.post(model_path("lm", version, "infer"), content=body, headers={
        "Inference-Header-Content-Length": declared,
        "Content-Type": "application/octet-stream"})  # fmt: skip
    check(client, response)


TFS_BODY = st.one_of(
    st.fixed_dictionaries({}, optional={
        "instances": st.one_of(st.lists(st.lists(IDS, max_size=20), max_size=4), JSON),
        "inputs": st.one_of(st.lists(st.lists(IDS, max_size=20), max_size=4),
                            st.dictionaries(NAMES.filter(lambda n: isinstance(n, str)),
                                            st.lists(st.lists(IDS, max_size=8), max_size=3),
                                            max_size=3), JSON),
        "signature_name": JSON}),
    JSON,
)  # fmt: skip


@FUZZ
@given(model=MODEL, version=VERSION, body=TFS_BODY)
def test_tf_serving_bodies(client, model, version, body):
    path = f"/v1/models/{quote(model, safe='')}"
    if version is not None:
        path += f"/versions/{quote(version, safe='')}"
    check(client, client.post(path + ":predict", content=dumps(body)))


TEXT_BODY = st.one_of(
    st.fixed_dictionaries({}, optional={
        "text_input": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, max_size=4), JSON),
        "parameters": st.one_of(st.fixed_dictionaries({}, optional={
            "max_tokens": st.one_of(st.integers(-2, 80), JSON),
            "stop_token_ids": st.one_of(st.lists(st.integers(-2, 300), max_size=3), JSON),
            "num_beams": st.one_of(st.integers(-1, 10), JSON),
            "length_penalty": st.one_of(st.floats(allow_nan=True), JSON),
            "early_stopping": st.one_of(st.sampled_from([True, False, "never"]), JSON),
            "no_repeat_ngram_size": st.one_of(st.integers(-1, 20), JSON),
            "pooling": JSON, "normalize": JSON}), JSON)}),
    JSON,
)  # fmt: skip
TEXT_ROUTES = ["classify", "tag", "embed", "generate", "generate_stream"]


@FUZZ
@given(model=st.sampled_from(["lm", "cls"]), route=st.sampled_from(TEXT_ROUTES), body=TEXT_BODY)
def test_text_bodies(client, model, route, body):
    check(client, client.post(model_path(model, None, route), content=dumps(body)))


OPENAI_BODY = st.one_of(
    st.fixed_dictionaries({}, optional={
        "model": st.one_of(st.sampled_from(["chat", "chat", "lm", "cls", "nope"]), JSON),
        "prompt": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, max_size=3),
                            st.lists(st.integers(-2, 600), max_size=40), JSON),
        "input": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, max_size=3), JSON),
        "query": st.one_of(ODD_TEXT, JSON), "top_n": st.one_of(st.integers(-1, 5), JSON),
        "documents": st.one_of(st.lists(ODD_TEXT, max_size=3), JSON),
        "messages": st.one_of(st.lists(st.fixed_dictionaries(
            {"role": st.one_of(ODD_TEXT, JSON)}, optional={"content": st.one_of(ODD_TEXT, JSON)}),
            max_size=3), JSON),
        "max_tokens": st.one_of(st.integers(-2, 80), JSON),
        "n": st.one_of(st.integers(-1, 10), JSON),
        "temperature": st.one_of(st.floats(allow_nan=True), JSON), "top_p": JSON, "seed": JSON,
        "stop": st.one_of(ODD_TEXT, st.lists(ODD_TEXT, max_size=3), JSON),
        "stream": st.one_of(st.booleans(), JSON), "echo": JSON, "stream_options": JSON,
        "encoding_format": JSON, "response_format": JSON,
        "logprobs": st.one_of(st.integers(-1, 7), st.booleans(), JSON),
        "top_logprobs": st.one_of(st.integers(-1, 22), JSON)}),
    JSON,
)  # fmt: skip


@FUZZ
@given(route=st.sampled_from(["chat/completions", "completions", "embeddings", "rerank"]),
       body=OPENAI_BODY)  # fmt: skip
def test_openai_bodies(client, route, body):
    check(client, client.post(f"/v1/{route}", content=dumps(body)))


ROUTES = st.sampled_from(["", "ready", "infer", "classify", "generate", "metadata"])
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE"])
ENCODINGS = st.sampled_from(["", "gzip", "deflate", "br", "x"])


@FUZZ
@given(model=MODEL, version=VERSION, route=ROUTES, method=METHODS, body=st.binary(max_size=64),
       encoding=ENCODINGS)  # fmt: skip
def test_paths_methods_and_raw_bytes(client, model, version, route, method, body, encoding):
    path = model_path(model, version, route).rstrip("/")
    headers = {"Content-Encoding": encoding} if encoding else {}
    check(client, client.request(method, path, content=body, headers=headers))
    tfs = f"/v1/models/{quote(model, safe='')}" + ("/metadata" if route == "metadata" else "")
    check(client, client.request(method, tfs, content=body))


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v2/models/lm/infer", b"[" * 100_000 + b"]" * 100_000),
        ("/v2/models/lm/infer", b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("/v2/models/cls/classify", b'{"text_input": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        ("/v1/models/lm:predict", b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("/v2/models/cls/classify", b'{"text_input": "\\ud800 a \\udfff"}'),
        ("/v2/models/lm/generate", b'{"text_input": "\\ud800"}'),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [2**32, 2**32],
                                                   "datatype": "INT32", "data": []}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [1, 2**64],
                                                   "datatype": "INT32", "data": [1]}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [0, 3],
                                                   "datatype": "INT32", "data": []}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [1, 0],
                                                   "datatype": "INT32", "data": []}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": ["token_ids"], "shape": [1, 1],
                                                   "datatype": {"a": 1}, "data": [1]}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [1, 1],
                                                   "datatype": "INT32", "data": [1]}],
                                       "outputs": [{"name": {"x": 1}}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [], "parameters": [1]})),
        ("/v2/models/lm/versions/%C2%B2/infer", dumps({"inputs": []})),
        (f"/v2/models/{'x' * 5000}/infer", dumps({"inputs": []})),
        ("/v2/models/lm/generate", dumps({"text_input": "to", "parameters": {
            "stop_token_ids": [1e30]}})),
    ],
)  # fmt: skip
def test_the_inputs_that_gave_500_in_issue_19(client, path, body):
    response = client.post(path, content=body)
    check(client, response)
    assert 400 <= response.status_code < 500 or response.status_code == 200, response.text


IDS_1X1 = {"name": "token_ids", "shape": [1, 1], "datatype": "INT32", "data": [1]}


@pytest.mark.parametrize(
    "path, body",
    [
        # 10,000 repetitions of one output: refused, not encoded 10,000 times.
        ("/v2/models/lm/infer",
         dumps({"inputs": [IDS_1X1], "outputs": [{"name": "logits"}] * 10_000})),
        # Huge texts: cut before tokenizing (classify), refused (a prompt past the cap).
        ("/v2/models/cls/classify", dumps({"text_input": "to be " * 170_000})),
        ("/v2/models/cls/classify", dumps({"text_input": ["to be " * 2_000] * 80})),
        ("/v2/models/cls/classify", dumps({"text_input": ["a"] * 65})),  # past the row limit
        ("/v2/models/lm/generate", dumps({"text_input": "x" * 150_000})),
        ("/v2/models/lm/generate", dumps({"text_input": "to be " * 10_000})),
        ("/v2/models/cls/embed", dumps({"text_input": " " * 500_000 + "to be"})),
        # Shapes with zero dims and 2**32, and data that does not fill them.
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [2**32, 0],
                                                   "datatype": "INT32", "data": []}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [0, 2**32],
                                                   "datatype": "INT32", "data": []}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [2**32] * 9,
                                                   "datatype": "INT32", "data": []}]})),
        ("/v2/models/lm/infer", dumps({"inputs": [{"name": "token_ids", "shape": [1024, 4096],
                                                   "datatype": "BYTES", "data": ["a"]}]})),
        # Parsed in the worker process (over 128 KiB), but nested deeper than pickle goes.
        ("/v2/models/lm/infer", b'{"inputs": [], "deep": ' + b"[" * 700 + b"]" * 700
         + b', "pad": "' + b"x" * 200_000 + b'"}'),
        # Negative and non-finite parameters.
        ("/v2/models/lm/infer", dumps({"inputs": [IDS_1X1], "parameters": {"timeout": -5}})),
        ("/v2/models/lm/infer", b'{"inputs": [], "parameters": {"timeout": -Infinity}}'),
        ("/v2/models/lm/infer", b'{"inputs": [], "parameters": {"timeout": NaN}}'),
        ("/v2/models/lm/generate", b'{"text_input": "to", "parameters": {"max_tokens": -1}}'),
        ("/v2/models/lm/generate", b'{"text_input": "to", "parameters": {"max_tokens": 1e999}}'),
        # Broken version folders in the repository, asked for by name.
        *[(f"/v2/models/{name}/infer", dumps({"inputs": [IDS_1X1]})) for name in BROKEN],
        *[(f"/v2/repository/models/{name}/load", b"") for name in BROKEN],
    ],
)  # fmt: skip
def test_the_inputs_of_issue_26(client, path, body):
    response = client.post(path, content=body)
    check(client, response)
    assert response.status_code in (200, 400, 404, 413), response.text


HUGE = b"1" + b"0" * 400  # a JSON integer past float range


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v2/models/lm/generate",
         b'{"text_input": "to", "parameters": {"temperature": ' + HUGE + b"}}"),
        ("/v2/models/lm/generate", b'{"text_input": "to", "parameters": {"top_p": ' + HUGE + b"}}"),
        ("/v2/models/lm/generate",
         b'{"text_input": "to", "parameters": {"temperature": -' + HUGE + b"}}"),
        ("/v2/models/lm/infer", b'{"inputs": [], "parameters": {"timeout": ' + HUGE + b"}}"),
    ],
)  # fmt: skip
def test_numbers_past_float_range_are_a_400_naming_the_field(client, path, body):
    response = client.post(path, content=body)
    check(client, response)
    assert response.status_code == 400, response.text
    assert any(name in response.json()["error"] for name in ("temperature", "top_p", "timeout"))


@pytest.mark.parametrize(
    "parameters",
    [
        {"temperature": 1e-308},
        {"temperature": 5e-324},
        {"top_p": 1e-12},
        {"top_p": 1e-9, "temperature": 2.0},
    ],
)
def test_vanishing_temperature_or_top_p_is_greedy_not_id_zero(client, parameters):
    plain = client.post("/v2/models/lm/generate", json={
        "text_input": "to be", "parameters": {"max_tokens": 6}})  # fmt: skip
    check(client, plain)
    greedy = plain.json()["token_ids"]
    response = client.post(
        "/v2/models/lm/generate",
        json={"text_input": "to be", "parameters": {"max_tokens": 6, "seed": 3, **parameters}},
    )
    check(client, response)
    assert response.json()["token_ids"] == greedy
    assert 0 not in greedy


@pytest.mark.parametrize(
    "name, words",
    [("infinite_delay", "max_delay_ms"), ("huge_delay", "max_delay_ms"),
     ("tokenizer_not_json", "tokenizer.json"), ("tokenizer_bad_regex", "tokenizer.json")],
)  # fmt: skip
def test_operator_files_are_refused_naming_the_file_and_reason(client, name, words):
    response = client.post(f"/v2/models/{name}/infer", content=dumps({"inputs": [IDS_1X1]}))
    check(client, response)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert words in error and "(Exception)" not in error and "JSONDecodeError" not in error, error


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize("text", ["to be <extra_2>", "<extra_4>", "to <extra_0> be <extra_1>"])
def test_prompt_tokens_past_the_model_vocabulary_are_a_400(client, route, text):
    response = client.post(f"/v2/models/extra_tokens/{route}", content=dumps(
        {"text_input": text, "parameters": {"max_tokens": 4}}))  # fmt: skip
    check(client, response)
    assert response.status_code == 400, response.text
    assert "no embedding" in response.json()["error"]
    fine = client.post("/v2/models/extra_tokens/generate", content=dumps(
        {"text_input": "to be", "parameters": {"max_tokens": 4}}))  # fmt: skip
    check(client, fine)
    assert fine.status_code == 200, fine.text
