"""deploy/: the Kubernetes manifests pass the schema validators (strict: unknown fields are
errors), and the Dockerfile and manifests agree with the server they start."""

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from keras_attn_serving.cli import parse_settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KSERVE_SCHEMA = DEPLOY / "schemas" / "inferenceservice-v1beta1.json"


def documents(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def containers():
    """`(where, container)` for every container the manifests run."""
    found = []
    for doc in documents("kubernetes.yaml"):
        if doc["kind"] == "Deployment":
            found += [("kubernetes.yaml", c) for c in doc["spec"]["template"]["spec"]["containers"]]
    for doc in documents("kserve.yaml"):
        found += [("kserve.yaml", c) for c in doc["spec"]["predictor"]["containers"]]
    return found


def dockerfile():
    """The Dockerfile's instructions, `(keyword, argument)`, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def test_kubernetes_manifests_validate_strictly():
    version = kubernetes_validate.utils.latest_version()
    for doc in documents("kubernetes.yaml"):
        kubernetes_validate.validate(doc, version, strict=True)
    kinds = [d["kind"] for d in documents("kubernetes.yaml")]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    # The validator refuses what the API server would: a misspelt field.
    (deployment,) = [d for d in documents("kubernetes.yaml") if d["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecondz"] = 5
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecondz"):
        kubernetes_validate.validate(deployment, version, strict=True)


def check_jsonschema(path):
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--schemafile", str(KSERVE_SCHEMA), str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_kserve_inference_service_validates_against_kserve_crd_schema(tmp_path):
    result = check_jsonschema(DEPLOY / "kserve.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    bad = (DEPLOY / "kserve.yaml").read_text().replace("scaleTarget:", "scaleTargett:")
    (tmp_path / "bad.yaml").write_text(bad)
    result = check_jsonschema(tmp_path / "bad.yaml")
    assert result.returncode == 1 and "scaleTargett" in result.stdout


def test_schema_maker_makes_objects_strict():
    sys.path.insert(0, str(DEPLOY / "schemas"))
    try:
        from make_schema import strict
    finally:
        sys.path.pop(0)
    crd_part = {"type": "object", "description": "x", "properties": {
        "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}]},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"a": {"type": "string"}}}}}  # fmt: skip
    assert strict(crd_part) == {"type": "object", "additionalProperties": False, "properties": {
        "port": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "free": {"type": "object", "properties": {"a": {"type": "string"}}}}}  # fmt: skip
    schema = json.loads(KSERVE_SCHEMA.read_text())
    assert schema["properties"]["kind"] == {"const": "InferenceService"}


def test_containers_start_the_server_with_valid_settings_and_probe_its_routes(monkeypatch):
    from keras_attn_serving.routes_v2 import router

    routes = {route.path for route in router.routes}
    for where, container in containers():
        env = {e["name"]: e["value"] for e in container["env"]}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = parse_settings(container["args"])  # a bad flag or value exits
        assert str(settings.model_repository) == env["KERAS_ATTN_MODEL_REPOSITORY"], where
        assert settings.host == "0.0.0.0", where  # reachable from outside the pod
        ports = [p["containerPort"] for p in container["ports"]]
        assert ports == [settings.port], where
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["path"] in routes, (where, probe)
        for name in env:
            monkeypatch.delenv(name)


def test_dockerfile_installs_the_serving_side_only_and_runs_the_server(monkeypatch):
    from keras_attn_serving.routes_v2 import router

    steps = dockerfile()
    keywords = [k for k, _ in steps]
    assert keywords[0] == "FROM" and steps[0][1].startswith("python:3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serve = project["optional-dependencies"]["serve"]
    assert not [r for r in serve if re.match(r"(tensorflow|keras)\b", r)]
    (run,) = [arg for k, arg in steps if k == "RUN" and "pip install" in arg]
    assert "pip install --no-deps /src" in run
    # The requirements step, run here on this pyproject.toml: it lists the serve extra.
    command = shlex.split(run.split("&&")[0].split(">")[0])
    copied = {}
    for k, arg in steps:
        if k == "COPY":
            *sources, target = arg.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                copied[target.rstrip("/") + ("/" + source if target.endswith("/") else "")] = source
    assert copied["/src/pyproject.toml"] == "pyproject.toml"
    script = command[2].replace("/src/pyproject.toml", str(ROOT / "pyproject.toml"))
    listed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True).stdout.split("\n")  # fmt: skip
    assert [line for line in listed if line] == serve
    entrypoint = json.loads(dict(steps)["ENTRYPOINT"])
    assert entrypoint == ["keras-attn-serve"] and "keras-attn-serve" in project["scripts"]
    env = {}
    for k, arg in steps:
        if k == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(arg))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = parse_settings(json.loads(dict(steps)["CMD"]))
    assert (settings.host, settings.port) == ("0.0.0.0", int(dict(steps)["EXPOSE"]))
    # The health check asks the port the server listens on (KERAS_ATTN_PORT, else EXPOSE's).
    probe = json.loads(dict(steps)["HEALTHCHECK"].split("CMD", 1)[1])[-1]
    assert f"os.environ.get('KERAS_ATTN_PORT', '{settings.port}')" in probe
    assert "/v2/health/live" in probe and "/v2/health/live" in {r.path for r in router.routes}
