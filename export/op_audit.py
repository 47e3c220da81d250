"""Which ops an export needs, and whether its servers have them.

TF Serving 2.20 links core TensorFlow 2.20 and tensorflow-text 2.20's op
library; LiteRT runs TFLite builtins plus the kernels of
`tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`. An op outside those
sets makes a model that exports fine and fails when a server loads or runs
it. The reference op lists of TF 2.20 and tensorflow-text 2.20 are in
`export/reference/` (how they were made is recorded in each file).

    python -m export.op_audit EXPORT/1            # lists every op, exits 1 on a problem
    python -m export.op_audit --tflite model.tflite
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

from export.errors import missing_saved_model, newest_version
from keras_transformer.console import OneLineArgumentParser, stops_quietly_for_a_closed_pipe

REFERENCE = pathlib.Path(__file__).with_name("reference")
# Core TensorFlow ops that run a Python function of the process that built the graph: in
# TensorFlow's op list, but a SavedModel holding one fails wherever that process is not.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def _load(name):
    return json.loads((REFERENCE / name).read_text())


def saved_model_ops(path) -> tuple[dict, set]:
    """Every op in a SavedModel's graphs and all their library functions.

    Reads `saved_model.pb` as a proto; nothing is loaded or run. Returns
    `{op: {"count": n, "attrs": set}}` and the names of the library functions
    (nested while/cond bodies live there, and calls of them appear as ops).
    """
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
    ops = collections.defaultdict(lambda: {"count": 0, "attrs": set()})
    functions = set()

    def add(nodes):
        for node in nodes:
            ops[node.op]["count"] += 1
            ops[node.op]["attrs"].update(a for a in node.attr if not a.startswith("_"))

    for meta_graph in proto.meta_graphs:
        add(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            functions.add(function.signature.name)
            add(function.node_def)
    return dict(ops), functions


def audit_saved_model(path) -> list[dict]:
    """One row per op: `kind` is core / tensorflow_text / function / python / unknown;
    `problem` says why TF Serving 2.20 could not run it (absent otherwise)."""
    core = _load("tensorflow_2.20_ops.json")["ops"]
    text_ops = set(_load("tensorflow_text_2.20_ops.json")["ops"])
    ops, functions = saved_model_ops(path)
    rows = []
    for op in sorted(ops):
        row = {"op": op, "count": ops[op]["count"]}
        if op in PYTHON_OPS:
            row["kind"] = "python"
            row["problem"] = ("calls back into Python (tf.py_function / tf.numpy_function): the export's "
                              "Python code is not saved with it, and TF Serving and LiteRT have no Python")
        elif op in core:
            row["kind"] = "core"
            unknown_attrs = sorted(ops[op]["attrs"] - set(core[op]))
            if unknown_attrs:
                row["problem"] = f"attrs {unknown_attrs} are not in TensorFlow 2.20's definition"
        elif op in text_ops:
            row["kind"] = "tensorflow_text"
        elif op in functions:
            row["kind"] = "function"
        else:
            row["kind"] = "unknown"
            row["problem"] = "neither a TensorFlow 2.20 op nor in tensorflow-text 2.20's op library"
        rows.append(row)
    return rows


class NotTFLiteError(ValueError):
    """`audit_tflite` was given bytes that are not a TFLite flatbuffer."""


def audit_tflite(model) -> dict:
    """Ops of a .tflite flatbuffer (bytes or path): builtins, TF Text custom ops, and the rest.

    Returns `{"builtin": {name: count}, "tensorflow_text": {...}, "unsupported": {...}}`;
    `unsupported` holds Flex ops and custom ops without a LiteRT kernel. Raises
    `NotTFLiteError` on bytes without the TFL3 file identifier.
    """
    from tensorflow.lite.python import schema_py_generated as schema

    name = "the model given"
    if not isinstance(model, (bytes, bytearray)):
        name, model = str(model), pathlib.Path(model).read_bytes()
    if model[4:8] != b"TFL3":  # the flatbuffer's file identifier; the schema reader fails anywhere on others
        raise NotTFLiteError(f"{name} is not a TFLite model (no TFL3 file identifier)")
    text_kernels = set(_load("tensorflow_text_2.20_ops.json")["tflite_custom_ops"])
    parsed = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(model, 0))
    builtin_names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    report = {"builtin": collections.Counter(), "tensorflow_text": collections.Counter(),
              "unsupported": collections.Counter()}
    for subgraph in parsed.subgraphs:
        for operator in subgraph.operators:
            code = parsed.operatorCodes[operator.opcodeIndex]
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            if builtin != schema.BuiltinOperator.CUSTOM:
                report["builtin"][builtin_names[builtin]] += 1
            elif code.customCode.decode() in text_kernels:
                report["tensorflow_text"][code.customCode.decode()] += 1
            else:
                report["unsupported"][code.customCode.decode()] += 1
    return {kind: dict(sorted(counts.items())) for kind, counts in report.items()}


def build_parser() -> argparse.ArgumentParser:
    """The command line: `main` parses with it, and the command reference is made from it."""
    parser = OneLineArgumentParser(prog="export.op_audit", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("saved_model", nargs="?", help="an export version directory (EXPORT/1), or EXPORT or the model "
                        "directory that holds it: its newest version")
    parser.add_argument("--tflite", help="a .tflite file")
    parser.add_argument("--verbose", action="store_true",
                        help="also show TensorFlow's own start-up lines and warnings")
    return parser


@stops_quietly_for_a_closed_pipe
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.saved_model and not args.tflite:
        parser.error("give an export version directory (EXPORT/1), --tflite FILE, or both")
    args.saved_model = args.saved_model and (newest_version(args.saved_model) or args.saved_model)
    missing = args.saved_model and missing_saved_model(args.saved_model)
    if missing:
        parser.error(missing)
    if args.tflite and not pathlib.Path(args.tflite).is_file():
        parser.error(f"--tflite {args.tflite}: no such file")
    failed = False
    if args.saved_model:
        from google.protobuf.message import DecodeError

        try:
            rows = audit_saved_model(args.saved_model)
        except DecodeError as error:  # a truncated or foreign saved_model.pb
            parser.error(f"{args.saved_model}/saved_model.pb cannot be read as a SavedModel ({error})")
        print(f"{args.saved_model}: {len(rows)} distinct ops")
        for row in rows:
            print(f"  {row['kind']:15s} {row['op']:45s} x{row['count']}"
                  + (f"   PROBLEM: {row['problem']}" if "problem" in row else ""))
        failed |= any("problem" in row for row in rows)
    if args.tflite:
        try:
            report = audit_tflite(args.tflite)
        except NotTFLiteError as error:
            parser.error(f"--tflite {error}")
        for kind, counts in report.items():
            print(f"{args.tflite} {kind}: {counts}")
        failed |= bool(report["unsupported"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
