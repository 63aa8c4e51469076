"""KServe v2 (Open Inference Protocol) tensors: JSON `data`, and Triton's binary tensor
extension, which `tritonclient.http` uses by default.

With the extension a body is a JSON header of `Inference-Header-Content-Length` bytes
followed by raw tensor bytes, in input (or output) order; a tensor sent that way carries
`parameters.binary_data_size` instead of `data`. Numbers are little-endian and row-major;
`BYTES` elements are each a 4-byte little-endian length and that many bytes.
"""

import json
import math
import reprlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import numpy as np

DATATYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32",
    "UINT64": "uint64", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "object",
}  # fmt: skip
NUMPY_TO_V2 = {v: k for k, v in DATATYPES.items()}


# The longest error message a client gets back: messages quote what the client sent (names,
# values), and a 400 echoing 10,000 input names was 1.1 MB.
MAX_ERROR_CHARS = 500


_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel = 80, 80, 3
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = _SHOWN.maxset = 8


def shown(value: Any) -> str:
    """`repr(value)` cut as it is built: a client's 13 MB list is quoted in microseconds."""
    return _SHOWN.repr(value)


def bounded(message: str) -> str:
    """`message`, cut to `MAX_ERROR_CHARS` characters (marked with `…`)."""
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 1] + "…"


class ServingError(Exception):
    """An error answered as `{"error": message}` with an HTTP status (message bounded)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None) -> None:  # fmt: skip
        message = bounded(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.param, self.code = param, code  # OpenAI's error fields, on the /v1 routes

    def __reduce__(self):  # raised in a worker process, re-raised here with its status
        return (ServingError, (self.status, self.message, self.param, self.code))


# OpenAI's error `type` by status (the /v1 routes answer `{"error": {"message", "type",
# "param", "code"}}`).
OPENAI_ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error",
                      405: "invalid_request_error", 408: "timeout", 413: "invalid_request_error",
                      415: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
                      503: "server_error", 504: "timeout"}  # fmt: skip


OPENAI_PATHS = ("/v1/chat/", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/rerank")


def error_body(path: str, message: str, status: int, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The JSON body of an error: `{"error": message}`, or OpenAI's shape under `/v1/`."""
    if not path.startswith(OPENAI_PATHS) and path != "/v1/models":  # TF Serving's /v1/models/x
        return {"error": message}
    kind = OPENAI_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else
                                  "server_error")  # fmt: skip
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _bad(message):
    return ServingError(400, message)


def parse_json(body: bytes | str, what: str = "request body") -> Any:
    """JSON, or a 400 naming why not (bad syntax, nesting too deep for the parser)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise _bad(f"{what} is nested too deeply") from None
    except ValueError as error:
        raise _bad(f"{what} is not JSON: {error}"[:300]) from None


def _object(container, key, whose):
    """`container[key]` when it is an object (or absent: `{}`), else a 400."""
    value = container.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{whose} `{key}` must be an object; received {shown(value)}"[:200])
    return value


def _decode_bytes(raw, count, name):
    elements, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise _bad(f"input {shown(name)}: BYTES data ends inside an element's length prefix")
        length = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(raw):
            raise _bad(f"input {shown(name)}: BYTES element longer than the data sent")
        elements.append(raw[offset : offset + length])
        offset += length
    if offset != len(raw):
        raise _bad(f"input {shown(name)}: {len(raw) - offset} bytes left after {count} elements")
    return np.array(elements, dtype=object)


def _encode_bytes(array):
    parts = []
    for item in array.ravel():
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += [len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


# What a tensor's shape may say, whatever its data: ONNX models here take rank ≤ 3.
MAX_RANK, MAX_DIM = 8, 2**31 - 1


def _shape(tensor, name):
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _bad(f"input {shown(name)}: `shape` must be a list of non-negative integers")
    if len(shape) > MAX_RANK or any(d > MAX_DIM for d in shape):
        # NumPy cannot even describe an empty array of [2**32, 2**32, 0].
        raise _bad(
            f"input {shown(name)}: `shape` may have at most {MAX_RANK} dimensions of at most "
            f"{MAX_DIM} each; received {shape}"[:300]
        )
    return shape


def decode_request(
    body: bytes,
    header_length: str | int | None = None,
    inputs: Mapping[str, Mapping[str, Any]] | None = None,
    max_rows: int | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`(request, feeds)`: the JSON header as a dict (without `inputs`) and
    `{input name: numpy array}`.

    With the model's `inputs` (`{name: {"dtype": ...}}`, as in the manifest) and `max_rows`,
    every tensor's name, datatype and first dimension are checked before any data is
    decoded: a 16 MB BYTES body for a model that takes ids, or for too many rows, is refused
    without decoding it.
    """
    if header_length is None:
        header, binary = body, b""
    else:
        try:
            header_length = int(header_length)
        except ValueError:
            raise _bad("Inference-Header-Content-Length must be an integer") from None
        if not 0 < header_length <= len(body):
            raise _bad(
                f"Inference-Header-Content-Length {header_length} is outside the body "
                f"({len(body)} bytes)"
            )
        header, binary = body[:header_length], body[header_length:]
    request = parse_json(header, "request header")
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise _bad("request must be an object with an `inputs` list")
    _object(request, "parameters", "the request's")
    tensors = [_tensor_header(tensor, inputs, max_rows) for tensor in request["inputs"]]
    names = Counter(name for name, *_ in tensors)
    if names and max(names.values()) > 1:
        repeated = sorted(name for name, count in names.items() if count > 1)
        raise _bad(f"input names must be distinct; {repeated} appear more than once"[:300])
    feeds, offset = {}, 0
    for tensor, (name, datatype, dtype, shape) in zip(request["inputs"], tensors, strict=True):
        count = math.prod(shape)  # Python integers: [2**32, 2**32] does not wrap to 0
        size = _object(tensor, "parameters", f"input {shown(name)}").get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise _bad(
                    f"input {shown(name)}: binary_data_size {shown(size)} exceeds the data sent"[
                        :200
                    ]
                )
            raw, offset = binary[offset : offset + size], offset + size
            if dtype == "object":
                array = _decode_bytes(raw, count, name)
            elif size != count * np.dtype(dtype).itemsize:
                raise _bad(
                    f"input {shown(name)}: {size} bytes do not hold shape {shape} of "
                    f"{datatype} ({count * np.dtype(dtype).itemsize} bytes)"
                )
            else:
                array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
        elif "data" in tensor:
            array = _json_data(tensor["data"], dtype, datatype, name)
        else:
            raise _bad(f"input {shown(name)} has neither `data` nor `binary_data_size`")
        if array.size != count:
            raise _bad(
                f"input {shown(name)}: shape {shape} needs {count} values; received {array.size}"[
                    :300
                ]
            )
        feeds[name] = array.reshape(shape)
    if offset != len(binary):
        raise _bad(f"{len(binary) - offset} bytes of binary data belong to no input")
    # The request without its inputs: the data travels once, as arrays (from a worker
    # process, unpickling a million-number list would hold the event loop).
    return {k: v for k, v in request.items() if k != "inputs"}, feeds


# JSON values each datatype takes, by numpy kind: no strings, fractions or booleans read
# as numbers, and no strings or numbers read as booleans ("false" would be True).
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def _json_data(data, dtype, datatype, name):
    """A tensor's JSON `data` as an array of `dtype`, refused where a value is not one of
    `datatype`'s (numpy would cast `"5"` and `1.7` to the integer 5 and 1)."""
    try:
        array = np.asarray(data, dtype=object if dtype == "object" else None)
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise _bad(f"input {shown(name)}: data is not {datatype}: {error}"[:300]) from None
    if dtype == "object":
        return np.array([str(x).encode() for x in array.ravel()], dtype=object)
    want = np.dtype(dtype)
    kind = array.dtype.kind
    if (
        want.kind != "b"
        and kind in "iuf"
        and array.size
        and any(type(x) is bool for x in np.asarray(data, dtype=object).ravel())
    ):  # numpy reads `[1, true]` as integers
        kind = "b"
    if array.size and kind not in _JSON_KINDS.get(want.kind, want.kind):
        raise _bad(f"input {shown(name)}: data is not {datatype}: received "
                   f"{_JSON_NAMES.get(kind, 'other')} values")  # fmt: skip
    if array.size and want.kind in "iu":
        low, high = np.iinfo(want).min, np.iinfo(want).max
        if array.min() < low or array.max() > high:
            raise _bad(f"input {shown(name)}: data is not {datatype}: values outside "
                       f"[{low}, {high}]")  # fmt: skip
    return array.astype(want)


_JSON_NAMES = {"b": "boolean", "i": "integer", "u": "integer", "f": "fractional",
               "U": "string", "O": "mixed or out-of-range"}  # fmt: skip


def _tensor_header(tensor, inputs, max_rows):
    """`(name, datatype, numpy dtype, shape)` of one input, checked before its data."""
    if not isinstance(tensor, dict) or not {"name", "shape", "datatype"} <= set(tensor):
        raise _bad("each input needs name, shape and datatype")
    name = tensor["name"]
    if not isinstance(name, str):
        raise _bad(f"input names must be strings; received {shown(name)}"[:200])
    if inputs is not None and name not in inputs:
        raise _bad(f"unknown input {shown(name)}; the model takes {sorted(inputs)}"[:300])
    datatype = tensor["datatype"]
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        message = f"input {shown(name)}: unsupported datatype {datatype!r}; use one of "
        raise _bad(f"{message}{sorted(DATATYPES)}"[:300])
    wanted = None if inputs is None else inputs[name].get("dtype")
    if dtype == "object" and wanted not in (None, "object"):
        wanted = NUMPY_TO_V2.get(wanted, wanted)
        raise _bad(f"input {shown(name)} takes datatype {wanted}; received BYTES")
    shape = _shape(tensor, name)
    if max_rows is not None and shape and shape[0] > max_rows:
        raise ServingError(
            413, f"input {shown(name)} has {shape[0]} rows; at most {max_rows} per request "
                 "(--max-rows-per-request)",
        )  # fmt: skip
    return name, datatype, dtype, shape


def finite_number(value: Any) -> bool:
    """A JSON number (not a bool) that is finite as a float: a huge integer is not (and does
    not raise, as `math.isfinite` does past float range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def client_timeout_s(timeout_us: Any) -> float | None:
    """A request's `parameters.timeout` (tritonclient's, in microseconds) in seconds: None when
    absent or 0 (the server's own timeout applies), else a `ServingError` 400 unless it is a
    finite non-negative number (a negative or infinite one used to surface as a 504)."""
    if timeout_us is None or (type(timeout_us) in (int, float) and timeout_us == 0):
        return None
    if not finite_number(timeout_us) or timeout_us < 0:
        raise _bad(
            "`parameters.timeout` must be a non-negative number of microseconds; received "
            f"{shown(timeout_us)}"[:200]
        )
    return timeout_us / 1e6


def requested_outputs(
    request: dict[str, Any], available: Collection[str]
) -> list[tuple[str, bool]]:
    """`[(name, binary)]` to answer with: the ones asked for, or every output."""
    asked = request.get("outputs")
    default_binary = bool(_object(request, "parameters", "the request's").get(
        "binary_data_output", False))  # fmt: skip
    if not asked:
        return [(name, default_binary) for name in available]
    if not isinstance(asked, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in asked
    ):
        raise _bad("`outputs` must be a list of objects, each with a string name")
    unknown = sorted({o["name"] for o in asked} - set(available))
    if unknown:
        raise _bad(f"unknown outputs {unknown}; the model has {list(available)}"[:300])
    counts = Counter(o["name"] for o in asked)
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if repeated:
        # Each repetition would be encoded again: the response-size limit counts outputs once.
        raise _bad(f"`outputs` names {repeated} more than once; ask for each output once"[:300])
    return [
        (
            o["name"],
            bool(_object(o, "parameters", "an output's").get("binary_data", default_binary)),
        )
        for o in asked
    ]


def encode_response(
    header: dict[str, Any], outputs: dict[str, np.ndarray], wanted: Iterable[tuple[str, bool]]
) -> tuple[bytes, int | None]:
    """`(body, header_length)`: JSON, or JSON then binary tensors when any output asks for
    binary data (`header_length` is then the JSON's size, for Inference-Header-Content-Length)."""
    tensors, chunks = [], []
    for name, binary in wanted:
        array = np.asarray(outputs[name])
        datatype = NUMPY_TO_V2.get(str(array.dtype))
        if datatype is None:
            raise ServingError(
                500, f"output {shown(name)} has dtype {array.dtype}, not a v2 datatype"
            )
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            raw = (
                _encode_bytes(array)
                if datatype == "BYTES"
                else np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
            )
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BYTES":
            tensor["data"] = [x.decode() if isinstance(x, bytes) else str(x) for x in array.ravel()]
        else:
            tensor["data"] = array.ravel().tolist()
        tensors.append(tensor)
    text = json.dumps({**header, "outputs": tensors}).encode()
    if not chunks:
        return text, None
    return text + b"".join(chunks), len(text)
