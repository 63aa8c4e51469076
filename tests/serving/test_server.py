"""The HTTP server over real loopback: KServe v2 JSON, TF Serving REST, errors."""

import json
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from keras_attn_serving.server import ModelRepository, create_app

pytestmark = pytest.mark.tf_only  # the artifact fixture exports with TensorFlow


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_in_thread(app):
    """Runs `app` with uvicorn on a loopback port, with the connection limits of its settings
    (as `keras-attn-serve` does); returns `(url, stop)`."""
    import uvicorn
    from keras_attn_serving.connections import uvicorn_options

    port = free_port()
    options = uvicorn_options(app.state.settings)
    instance = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                             log_level="warning", **options))  # fmt: skip
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(url + "/v2/health/live")
            break
        except httpx.TransportError:
            time.sleep(0.05)

    def stop():
        instance.should_exit = True
        thread.join(10)

    return url, stop


def repository_folder(toy_artifact, root):
    folder, _ = toy_artifact
    shutil.copytree(folder, root / "toy" / "1")
    shutil.copytree(folder, root / "toy" / "3")
    return root


@pytest.fixture(scope="module")
def server(toy_artifact, tmp_path_factory):
    root = repository_folder(toy_artifact, tmp_path_factory.mktemp("repository"))
    shutil.copytree(toy_artifact[0], root / "broken" / "1")
    (root / "broken" / "1" / "model.onnx").write_bytes(b"tampered")
    (root / "empty" / "1").mkdir(parents=True)  # a version folder with no manifest.json
    url, stop = serve_in_thread(create_app(ModelRepository(root)))
    yield url
    stop()


IDS = [[5, 9, 12, 7], [8, 8, 3, 0]]


def v2_request(ids=IDS, datatype="INT64", **extra):
    return {"inputs": [{"name": "token_ids", "shape": list(np.shape(ids)), "datatype": datatype,
                        "data": np.ravel(ids).tolist()}], **extra}  # fmt: skip


def test_v2_health_metadata_and_readiness(server):
    assert httpx.get(server + "/v2").json()["name"] == "keras-attn-serve"
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/toy/ready",
                 "/v2/models/toy/versions/1/ready"):  # fmt: skip
        assert httpx.get(server + path).status_code == 200, path
    meta = httpx.get(server + "/v2/models/toy").json()
    assert meta["versions"] == ["1", "3"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "token_ids", "datatype": "INT32", "shape": [-1, -1]}]
    assert meta["outputs"][0]["name"] == "logits"


def test_v2_infer_matches_onnxruntime_and_casts_int64(server, toy_artifact):
    from keras_attn_serving import Predictor

    expected = Predictor(toy_artifact[0]).logits(np.array(IDS, "int32"))
    body = httpx.post(server + "/v2/models/toy/infer", json=v2_request(id="req-7")).json()
    assert body["id"] == "req-7" and body["model_version"] == "3"
    (out,) = body["outputs"]
    assert out["datatype"] == "FP32" and out["shape"] == list(expected.shape)
    np.testing.assert_allclose(np.reshape(out["data"], out["shape"]), expected, atol=1e-6)
    pinned = httpx.post(server + "/v2/models/toy/versions/1/infer", json=v2_request()).json()
    assert pinned["model_version"] == "1"


def test_tf_serving_rest_rows_and_columns(server, toy_artifact):
    from keras_attn_serving import Predictor

    expected = Predictor(toy_artifact[0]).logits(np.array(IDS, "int32"))
    status = httpx.get(server + "/v1/models/toy").json()
    assert status["model_version_status"][0] == {
        "version": "3", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}
    }  # fmt: skip
    assert (
        httpx.get(server + "/v1/models/toy/versions/1").json()["model_version_status"][0]["version"]
        == "1"
    )
    meta = httpx.get(server + "/v1/models/toy/metadata").json()
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["token_ids"]["dtype"] == "DT_INT32"
    rows = httpx.post(server + "/v1/models/toy:predict", json={"instances": IDS}).json()
    np.testing.assert_allclose(rows["predictions"], expected, atol=1e-6)
    columns = httpx.post(server + "/v1/models/toy/versions/1:predict",
                         json={"inputs": {"token_ids": IDS}}).json()  # fmt: skip
    np.testing.assert_allclose(columns["outputs"], expected, atol=1e-6)
    named_rows = httpx.post(server + "/v1/models/toy:predict",
                            json={"instances": [{"token_ids": r} for r in IDS]}).json()  # fmt: skip
    np.testing.assert_allclose(named_rows["predictions"], expected, atol=1e-6)


# fmt: off
ERRORS = [
        ("get", "/v2/models/nope", None, 404, "unknown model"),
        ("get", "/v2/models/toy/versions/2", None, 404, "no version 2"),
        ("get", "/v2/models/toy/versions/x1", None, 400, "invalid model version"),
        ("get", "/v2/models/.hidden/ready", None, 400, "invalid model name"),
        ("get", "/v2/models/a..b/ready", None, 400, "invalid model name"),
        ("get", "/v2/models/..%2F..%2Fetc/ready", None, 404, "Not Found"),
        ("get", "/v2/models/broken", None, 400, "sha256"),
        ("get", "/v2/models/empty", None, 400, "not ready: no manifest.json in empty/1"),
        ("post", "/v2/models/toy/infer", {"inputs": [{"name": "ids", "shape": [1, 1],
                                                      "datatype": "INT32", "data": [1]}]},
         400, "unknown input"),
        ("post", "/v2/models/toy/infer", v2_request(datatype="BYTES"), 400, "datatype"),
        ("post", "/v2/models/toy/infer", v2_request(datatype="FP32"), 400, "must be INT32"),
        ("post", "/v2/models/toy/infer", v2_request(ids=[1, 2, 3]), 400, "rank 2"),
        ("post", "/v2/models/toy/infer", v2_request(ids=[[1] * 40]), 400, "at most 24"),
        ("post", "/v2/models/toy/infer", v2_request(ids=[[1, 99999]]), 400, "outside"),
        ("post", "/v2/models/toy/infer", {"inputs": [{"name": "token_ids", "shape": [2, 2],
                                                      "datatype": "INT32", "data": [1]}]},
         400, "needs 4 values; received 1"),
        ("post", "/v2/models/toy/infer", v2_request(ids=[]) | {"inputs": [
            {"name": "token_ids", "shape": [1, -2], "datatype": "INT32", "data": []}]},
         400, "non-negative"),
        ("post", "/v2/models/toy/infer", {"inputs": [{"name": "token_ids", "shape": [1, 1],
                                                      "datatype": "INT32"}]},
         400, "neither `data` nor `binary_data_size`"),
        ("post", "/v2/models/toy/infer", {"nope": 1}, 400, "inputs"),
        ("post", "/v2/models/toy/infer", v2_request(outputs=[{"name": "x"}]), 400, "unknown"),
        ("post", "/v1/models/toy:predict", {"instances": [[1, 2], [3]]}, 400, "rectangular"),
        ("post", "/v1/models/toy:predict", {"instances": IDS, "inputs": IDS}, 400, "exactly one"),
        ("post", "/v1/models/nope:predict", {"instances": IDS}, 404, "unknown model"),
        ("get", "/no/such/route", None, 404, "Not Found"),
]
# fmt: on


@pytest.mark.parametrize("method, path, body, status, words", ERRORS)
def test_every_error_is_json_with_a_non_200_status(server, method, path, body, status, words):
    response = getattr(httpx, method)(server + path, **({"json": body} if body else {}))
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert str(Path(tempfile.gettempdir())) not in response.text  # no server paths


def test_body_limit_and_non_json(server, toy_artifact, tmp_path):
    bad = httpx.post(server + "/v2/models/toy/infer", content=b"{not json")
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    app = create_app(ModelRepository(repository_folder(toy_artifact, tmp_path)), max_body_bytes=10)
    from fastapi.testclient import TestClient

    big = TestClient(app).post("/v2/models/toy/infer", json=v2_request())
    assert big.status_code == 413 and "exceeds" in big.json()["error"]


def _expected(toy_artifact, ids=IDS):
    from keras_attn_serving import Predictor

    return Predictor(toy_artifact[0]).logits(np.array(ids, "int32"))


def test_tritonclient_sync_binary_and_json(server, toy_artifact):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(server.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("toy") and client.is_model_ready("toy", "1")
    assert client.get_model_metadata("toy")["inputs"][0]["name"] == "token_ids"
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    ids = triton.InferInput("token_ids", [2, 4], "INT64")  # the model takes INT32: cast
    ids.set_data_from_numpy(np.array(IDS, "int64"))  # binary by default
    result = client.infer("toy", [ids], request_id="r1")
    np.testing.assert_allclose(result.as_numpy("logits"), _expected(toy_artifact), atol=1e-6)
    assert result.get_response()["id"] == "r1"
    ids = triton.InferInput("token_ids", [2, 4], "INT32")
    ids.set_data_from_numpy(np.array(IDS, "int32"), binary_data=False)  # JSON both ways
    out = triton.InferRequestedOutput("logits", binary_data=False)
    result = client.infer("toy", [ids], outputs=[out], model_version="1")
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("logits"), _expected(toy_artifact), atol=1e-6)
    ids.set_data_from_numpy(np.array(IDS, "int32"))
    zipped = client.infer("toy", [ids], request_compression_algorithm="gzip")
    np.testing.assert_allclose(zipped.as_numpy("logits"), _expected(toy_artifact), atol=1e-6)
    for model, tensor, words in [
        ("nope", ids, "unknown model"),
        ("toy", triton.InferInput("ids", [2, 4], "INT32"), "unknown input"),
    ]:
        if tensor is not ids:
            tensor.set_data_from_numpy(np.array(IDS, "int32"))
        with pytest.raises(triton.InferenceServerException, match=words):
            client.infer(model, [tensor])
    client.close()


def test_tritonclient_aio(server, toy_artifact):
    import asyncio

    import tritonclient.http as triton
    import tritonclient.http.aio as triton_aio

    async def run():
        client = triton_aio.InferenceServerClient(server.removeprefix("http://"))
        try:
            assert await client.is_model_ready("toy")
            ids = triton.InferInput("token_ids", [2, 4], "INT32")
            ids.set_data_from_numpy(np.array(IDS, "int32"))
            return (await client.infer("toy", [ids])).as_numpy("logits")
        finally:
            await client.close()

    np.testing.assert_allclose(asyncio.run(run()), _expected(toy_artifact), atol=1e-6)


def _binary(header, *chunks):
    text = json.dumps(header).encode()
    return text + b"".join(chunks), {"Inference-Header-Content-Length": str(len(text))}


def test_binary_tensor_extension_byte_level(server, toy_artifact):
    raw = np.array(IDS, "<i4").tobytes()
    tensor = {"name": "token_ids", "shape": [2, 4], "datatype": "INT32",
              "parameters": {"binary_data_size": len(raw)}}  # fmt: skip
    body, headers = _binary({"inputs": [tensor], "outputs": [
        {"name": "logits", "parameters": {"binary_data": True}}]}, raw)  # fmt: skip
    response = httpx.post(server + "/v2/models/toy/infer", content=body, headers=headers)
    assert response.status_code == 200
    length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:length])
    (out,) = header["outputs"]
    logits = np.frombuffer(response.content[length:], "<f4").reshape(out["shape"])
    assert out["parameters"]["binary_data_size"] == logits.nbytes == len(response.content) - length
    np.testing.assert_allclose(logits, _expected(toy_artifact), atol=1e-6)
    # BYTES: each element is a 4-byte little-endian length, then the bytes.
    from keras_attn_serving.protocol import ServingError, _decode_bytes, _encode_bytes

    words = np.array([b"a", b"", "Dvořák".encode()], dtype=object)
    assert _encode_bytes(words)[:5] == b"\x01\x00\x00\x00a"
    assert list(_decode_bytes(_encode_bytes(words), 3, "x")) == list(words)
    with pytest.raises(ServingError, match="BYTES element longer"):
        _decode_bytes(b"\x09\x00\x00\x00ab", 1, "x")

    def post(header, *chunks, length=None):
        body, headers = _binary(header, *chunks)
        if length is not None:
            headers["Inference-Header-Content-Length"] = length
        return httpx.post(server + "/v2/models/toy/infer", content=body, headers=headers)

    short = dict(tensor, parameters={"binary_data_size": 8})
    cases = [
        (post({"inputs": [short]}, raw[:8]), "do not hold shape [2, 4]"),
        (post({"inputs": [tensor]}, raw, b"xx"), "2 bytes of binary data belong to no input"),
        (post({"inputs": [tensor]}, raw[:-4]), "exceeds the data sent"),
        (post({"inputs": [tensor]}, raw, length="abc"), "must be an integer"),
        (post({"inputs": [tensor]}, raw, length="999999"), "outside the body"),
        (
            post(
                {"inputs": [dict(tensor, datatype="BYTES", parameters={"binary_data_size": 6})]},
                b"\x09\x00\x00\x00ab",
            ),
            # Refused before its data is decoded: the model takes ids.
            "takes datatype INT32; received BYTES",
        ),
        (post({"inputs": [dict(tensor, datatype="FP64")]}, raw), "do not hold"),
    ]
    for response, words in cases:
        assert response.status_code == 400, response.text
        assert words in response.json()["error"], response.json()
    unsupported = httpx.post(server + "/v2/models/toy/infer", content=b"{}",
                             headers={"Content-Encoding": "br"})  # fmt: skip
    assert unsupported.status_code == 415 and "Content-Encoding" in unsupported.json()["error"]
    garbled = httpx.post(server + "/v2/models/toy/infer", content=b"not gzip",
                         headers={"Content-Encoding": "gzip"})  # fmt: skip
    assert garbled.status_code == 400 and "gzip" in garbled.json()["error"]


def test_chunked_body_is_refused_once_it_passes_the_limit(toy_artifact, tmp_path):
    """A chunked upload (no Content-Length) is counted while it streams: the 413 comes once the
    limit is passed, while the client is still sending (issue 19: a 300 MB chunked body was
    read whole first). The client here never finishes its body: a server that waits for the
    end never answers."""
    import socket

    url, stop = serve_in_thread(
        create_app(ModelRepository(repository_folder(toy_artifact, tmp_path)), max_body_bytes=1000)
    )
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v2/models/toy/infer HTTP/1.1\r\nHost: x\r\n"
                b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
            )
            for _ in range(5):  # 5 KB of a body that would go on
                sock.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
            answer = sock.recv(4096).decode()
    finally:
        stop()
    assert answer.startswith("HTTP/1.1 413"), answer[:200]
    assert "exceeds 1000 bytes" in answer


def test_docs_and_openapi_are_off_by_default(toy_artifact):
    from fastapi.testclient import TestClient

    client = TestClient(create_app(ModelRepository(toy_artifact[0].parent)))
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert client.get(path).status_code == 404, path
    client = TestClient(create_app(ModelRepository(toy_artifact[0].parent), openapi=True))
    assert client.get("/openapi.json").status_code == 200


def test_unexpected_error_is_a_plain_500_that_closes_the_connection(toy_artifact, monkeypatch):
    """No exception text (paths, node names, addresses) reaches the client, and the client is
    told the connection closes (issue 19: keep-alive clients saw a reset)."""
    from fastapi.testclient import TestClient

    repository = ModelRepository(toy_artifact[0].parent)

    def broken(*args, **kwargs):
        raise RuntimeError("/secret/path node_42 at 0x7f00deadbeef")

    monkeypatch.setattr(repository, "get", broken)
    client = TestClient(create_app(repository), raise_server_exceptions=False)
    response = client.get("/v2/models/toy_lm")
    assert response.status_code == 500
    assert response.json() == {"error": "internal error"}
    assert response.headers["connection"] == "close"


@pytest.fixture
def answered(monkeypatch):
    """The path parameters of each request the `Gate` answered directly (`Gate._answer`)."""
    from keras_attn_serving.handling import Gate

    seen = []
    answer = Gate._answer

    async def counted(self, route, params, *args):
        seen.append(params)
        await answer(self, route, params, *args)

    monkeypatch.setattr(Gate, "_answer", counted)
    return seen


def test_direct_infer_answers_as_the_fastapi_route(toy_artifact, tmp_path, monkeypatch, answered):
    """The `Gate` answers v2 `infer` itself (no FastAPI routing): every answer, good or bad,
    is byte for byte the route's, and it is counted under the route's name."""
    from fastapi.testclient import TestClient
    from keras_attn_serving import routes_v2

    direct_routes = routes_v2.DIRECT
    root = repository_folder(toy_artifact, tmp_path)
    ids = np.array([[5, 9, 12, 7], [3, 4, 0, 0]], np.int32)
    header = json.dumps({"inputs": [{"name": "token_ids", "shape": [2, 4], "datatype": "INT32",
                                     "parameters": {"binary_data_size": ids.nbytes}}],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
                         "id": "b"}).encode()  # fmt: skip
    binary = {"content": header + ids.tobytes(),
              "headers": {"Inference-Header-Content-Length": str(len(header))}}  # fmt: skip
    calls = [
        ("post", "/v2/models/toy/infer", {"json": v2_request(id="a")}),
        ("post", "/v2/models/toy/versions/1/infer", {"json": v2_request()}),
        ("post", "/v2/models/toy/versions/3/infer", binary),
        ("post", "/v2/models/toy/infer", {"content": b"{not json"}),
        ("post", "/v2/models/toy/infer", {"json": v2_request(ids=[[5, 10**6]])}),
        ("post", "/v2/models/nope/infer", {"json": v2_request()}),
        ("post", "/v2/models/toy/versions/7/infer", {"json": v2_request()}),
        ("post", "/v2/models/toy/versions/x/infer", {"json": v2_request()}),
        ("post", "/v2/models/toy/extra/infer", {"json": v2_request()}),
        ("post", "/v2/models/toy/infer?version=1", {"json": v2_request()}),
        ("post", "/v2/models/toy/infer?version=x", {"json": v2_request()}),
        ("post", "/v2/models/toy/infer?version=9", {"json": v2_request()}),
        ("post", "/v2/models/toy/versions/1/infer?version=9", {"json": v2_request()}),
        ("post", "/v2/models/toy/infer/", {"json": v2_request()}),
        ("get", "/v2/models/toy/infer", {}),
        ("head", "/v2/models/toy/infer", {}),
    ]
    answers = {}
    for direct in (True, False):
        if not direct:
            # every POST but those to `/toy/extra/infer` and `/infer/`
            assert len(answered) == 12 and answered[2] == {"name": "toy", "version": "3"}
            monkeypatch.setattr(routes_v2, "DIRECT", ())
        client = TestClient(create_app(ModelRepository(root)), follow_redirects=False)
        answers[direct] = [
            getattr(client, method)(path, **kwargs) for method, path, kwargs in calls
        ]
        metrics = client.get("/metrics").text
        assert (
            'keras_attn_requests_total{route="/v2/models/{name}/infer",status="200"} 2.0' in metrics
        )
        assert ('keras_attn_requests_total{route="/v2/models/{name}/versions/{version}/infer",'
                'status="200"} 3.0') in metrics  # fmt: skip
    assert len(answered) == 12  # none more without `DIRECT`
    monkeypatch.setattr(routes_v2, "DIRECT", direct_routes)
    mounted = TestClient(create_app(ModelRepository(root)), root_path="/api")  # behind a proxy
    assert mounted.post("/api/v2/models/toy/infer", json=v2_request()).status_code == 200
    assert len(answered) == 13
    statuses = [r.status_code for r in answers[True]]
    assert statuses == [200, 200, 200, 400, 400, 404, 404, 400, 404, 200, 400, 404, 200, 307,
                        405, 405]  # fmt: skip
    for ours, routed in zip(answers[True], answers[False], strict=True):
        assert (ours.status_code, ours.content) == (routed.status_code, routed.content)
        assert dict(ours.headers) == dict(routed.headers)
    assert answers[True][0].json()["id"] == "a"
    assert answers[True][2].headers["inference-header-content-length"] is not None


def test_unexpected_error_in_direct_infer_is_the_same_500(
    toy_artifact, monkeypatch, caplog, answered
):  # fmt: skip
    from fastapi.testclient import TestClient
    from keras_attn_serving import routes_v2

    async def broken(*args, **kwargs):
        raise RuntimeError("/secret/path node_42 at 0x7f00deadbeef")

    answers = []
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(routes_v2, "DIRECT", ())
        repository = ModelRepository(toy_artifact[0].parent)
        monkeypatch.setattr(repository, "load", broken)
        client = TestClient(create_app(repository), raise_server_exceptions=False)
        caplog.clear()
        answers.append(client.post("/v2/models/toy_lm/infer", json=v2_request()))
        logged = [r for r in caplog.records if r.getMessage().startswith("internal error")]
        assert logged[0].getMessage() == "internal error on POST /v2/models/toy_lm/infer"
        assert logged[0].exc_info is not None and "0x7f00deadbeef" in str(logged[0].exc_info[1])
        metrics = client.get("/metrics").text
        assert (
            'keras_attn_errors_total{route="/v2/models/{name}/infer",status="500"} 1.0' in metrics
        )
    assert answered == [{"name": "toy_lm"}]  # the first app answered directly; the second did not
    for response in answers:
        assert response.status_code == 500
        assert response.json() == {"error": "internal error"}
        assert response.headers["connection"] == "close"
    assert dict(answers[0].headers) == dict(answers[1].headers)


def test_one_thread_sessions_tune_on_cpu_seconds(toy_artifact, tmp_path, monkeypatch):
    """cores // workers = 1 (2 cores, 2 workers): each batch computes in its worker's thread
    alone, and the tuner times it in CPU seconds; with more threads, in wall seconds."""
    import time

    from keras_attn_serving import repository as repository_module

    root = repository_folder(toy_artifact, tmp_path)
    clocks = {}
    for cores in (2, 4):
        monkeypatch.setattr(repository_module, "_cores", lambda cores=cores: cores)
        repository = ModelRepository(root, workers=2)
        *_, batcher = repository.batcher("toy")
        clocks[cores] = (repository.num_threads, batcher._clock)
        repository.close()
    assert clocks == {2: (1, time.thread_time), 4: (2, time.perf_counter)}


def test_model_folders_that_are_not_folders_are_unknown(tmp_path):
    """A missing model, a file, and a symlink loop are 404s (as `Path.is_dir` has them); a
    version entry that is a loop or a file is not a version."""
    from keras_attn_serving.protocol import ServingError

    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "model" / "2").mkdir(parents=True)
    (tmp_path / "model" / "3").symlink_to(tmp_path / "model" / "3")
    (tmp_path / "model" / "4").write_text("x")
    repository = ModelRepository(tmp_path)
    for name in ("absent", "file", "loop"):
        with pytest.raises(ServingError) as raised:
            repository.versions(name)
        assert raised.value.status == 404 and "unknown model" in raised.value.message
    assert repository.versions("model") == [2]


def test_ready_only_with_a_servable_model(toy_artifact, tmp_path):
    from fastapi.testclient import TestClient

    empty = TestClient(create_app(ModelRepository(tmp_path)))
    response = empty.get("/v2/health/ready")
    assert response.status_code == 503 and "no model" in response.json()["error"]
    assert empty.get("/v2/health/live").status_code == 200
    unversioned = TestClient(create_app(ModelRepository(toy_artifact[0].parent)))
    assert unversioned.get("/v2/health/ready").status_code == 503  # NAME/ without NAME/1/
    full = TestClient(create_app(ModelRepository(repository_folder(toy_artifact, tmp_path))))
    assert full.get("/v2/health/ready").status_code == 200


def test_a_small_request_cannot_buy_a_huge_answer(toy_artifact, tmp_path, monkeypatch):
    """Rows and output bytes are checked before any compute (issue 19: a 768 KB request got a
    210 MB JSON answer and stalled health checks for 5 s)."""
    from fastapi.testclient import TestClient
    from keras_attn_serving.batching import Batcher

    def never(self, feeds):
        raise AssertionError("the model ran")

    root = repository_folder(toy_artifact, tmp_path)
    # toy logits: (rows, seq, vocab) float32: 3 rows x 4 positions pass the limit by a byte.
    vocab = json.loads((root / "toy" / "1" / "manifest.json").read_text())["vocabulary_size"]
    client = TestClient(create_app(ModelRepository(root), max_output_bytes=3 * 4 * vocab * 4 - 1,
                                   max_rows_per_request=3))  # fmt: skip
    assert client.get("/v2/models/toy").status_code == 200  # loaded (its padding probe ran)
    monkeypatch.setattr(Batcher, "submit", never)
    too_many = client.post("/v2/models/toy/infer", json=v2_request(ids=[[5, 9]] * 4))
    assert too_many.status_code == 413 and "at most 3 per request" in too_many.json()["error"]
    too_big = client.post("/v2/models/toy/infer", json=v2_request(ids=[[5, 9, 12, 7]] * 3))
    assert too_big.status_code == 413
    assert f"would hold {3 * 4 * vocab * 4} bytes" in too_big.json()["error"]
    tfs = client.post("/v1/models/toy:predict", json={"instances": [[5, 9, 12, 7]] * 3})
    assert tfs.status_code == 413


def test_tritonclient_keeps_going_after_4xx_and_500_on_one_connection(toy_artifact, tmp_path):
    """Issue 19: after a 500 the keep-alive connection was reset under the client
    (tritonclient: HTTPConnectionClosed). Now a 500 says `Connection: close`, and the same
    client object's next requests are answered."""
    import tritonclient.http as triton

    repository = ModelRepository(repository_folder(toy_artifact, tmp_path))
    load = repository.load

    async def boom(name, version=None):
        if name == "boom":
            raise RuntimeError("/secret/path at 0x7f00deadbeef")
        return await load(name, version)

    repository.load = boom
    (tmp_path / "boom" / "1").mkdir(parents=True)
    url, stop = serve_in_thread(create_app(repository))
    try:
        client = triton.InferenceServerClient(url.removeprefix("http://"))
        ids = triton.InferInput("token_ids", [2, 4], "INT32")
        ids.set_data_from_numpy(np.array(IDS, "int32"))
        expected = _expected(toy_artifact)
        for bad_model, words in [("boom", "internal error"), ("nope", "unknown model"),
                                 ("boom", "internal error")]:  # fmt: skip
            with pytest.raises(triton.InferenceServerException, match=words):
                client.infer(bad_model, [ids])
            result = client.infer("toy", [ids])
            np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-6)
        client.close()
    finally:
        stop()


def test_an_error_quoting_10000_input_names_stays_small(server):
    """It echoed every name: 1.1 MB for one 400 (issue 26)."""
    inputs = [{"name": f"input_{i}", "shape": [1, 1], "datatype": "INT32", "data": [1]}
              for i in range(10_000)]  # fmt: skip
    response = httpx.post(server + "/v2/models/toy/infer", json={"inputs": inputs}, timeout=60)
    assert response.status_code == 400 and "unknown input" in response.json()["error"]
    assert len(response.content) < 600
