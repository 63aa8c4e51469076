"""`keras-attn-export MODEL.keras OUT_DIR`: the command-line face of `export_model`."""

import argparse
import sys

from export.parity import ParityError


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="keras-attn-export",
        description="Export a saved Keras model (.keras) to a verified artifact folder: "
        "SavedModel and/or ONNX, parity-checked against Keras, optionally optimized and "
        "quantized.",
    )
    parser.add_argument("model", help="path to a .keras file")
    parser.add_argument("out_dir", help="artifact folder to write (replaced if it exists)")
    parser.add_argument(
        "--formats", default="saved_model,onnx", help="comma-separated: saved_model,onnx"
    )
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset, 13 to 18")
    parser.add_argument(
        "--optimize", action="store_true", help="also write model.opt.onnx (fused operators)"
    )
    parser.add_argument(
        "--quantize", choices=["int8"], default=None, help="also write model.int8.onnx"
    )
    parser.add_argument("--tolerance", type=float, default=1e-4)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import keras

    import keras_attn  # noqa: F401  registers the layers and models for loading
    from export.api import export_model

    model = keras.saving.load_model(args.model)
    try:
        manifest = export_model(
            model,
            args.out_dir,
            formats=[f.strip() for f in args.formats.split(",") if f.strip()],
            opset=args.opset,
            optimize=args.optimize,
            quantize=args.quantize,
            tolerance=args.tolerance,
        )
    except (ParityError, ValueError) as error:
        print(f"keras-attn-export: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir} ({len(manifest['files'])} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
