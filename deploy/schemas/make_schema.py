"""Writes a JSON Schema for a Kubernetes custom resource from its CRD, for check-jsonschema.

    python deploy/schemas/make_schema.py serving.kserve.io_inferenceservices.yaml v1beta1 \
        deploy/schemas/inferenceservice-v1beta1.json

Takes the named version's `openAPIV3Schema` and makes it strict the way the API server is with
`kubectl apply --validate=strict`: an object that lists its `properties` refuses others (unless
it says `x-kubernetes-preserve-unknown-fields` or has `additionalProperties`), and
`x-kubernetes-int-or-string` takes an integer or a string. Descriptions are dropped (most of
the file's size). Run once when KServe's CRD changes; the tests read the result, offline. The
file here was made from kserve/kserve at aaac4e29 (2026-08-21),
`config/crd/full/serving.kserve.io_inferenceservices.yaml`.
"""

import json
import sys
from typing import Any

import yaml


def strict(node: Any) -> Any:
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items() if key != "description"}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out.pop("anyOf", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.get("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return {key: value for key, value in out.items() if not key.startswith("x-kubernetes-")}


def main(crd_path: str, version: str, out_path: str) -> None:
    with open(crd_path) as f:
        crd = yaml.safe_load(f)
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strict(entry["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{version}"}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "spec"})
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    with open(out_path, "w") as f:
        json.dump(schema, f, separators=(",", ":"), sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
