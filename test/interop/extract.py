#!/usr/bin/env python3
"""Extract the safetensors and TensorBoard projects' own test vectors.

The byte strings that the upstream test suites assert (a safetensors file
that `safetensors.torch.save` must produce, an event record dumped from a
real TensorFlow run, the files their readers must refuse) are cut out of
their sources at a pinned commit and written as files under
transformer/testdata/upstream and metrics/testdata/upstream, where the Go
tests read them with gorun's own reader and writer. CI has no network, so
the files are committed; this script is how they were made and how to
refresh them:

    python3 test/interop/extract.py SAFETENSORS_GIT_DIR TENSORBOARD_GIT_DIR

The git directories are clones (bare is fine) of huggingface/safetensors
and tensorflow/tensorboard that hold the commits below. The script also
writes test/interop/UPSTREAM.md, which names the source of every file.
"""

import ast
import os
import subprocess
import sys

SAFETENSORS = ("huggingface/safetensors", "24b0b2857fef49be734b9ab72ce97c09bb25f5b9")
TENSORBOARD = ("tensorflow/tensorboard", "70b76c922822dcccc3e8d7e5dd89860948690357")

ST_PY = "bindings/python/tests/test_simple.py"
ST_PT = "bindings/python/tests/test_pt_comparison.py"
ST_RS = "safetensors/src/tensor.rs"
TB_REC = "tensorboard/data/server/tf_record.rs"
TB_CRC = "tensorboard/data/server/masked_crc.rs"

# Each vector: output file, upstream test, and the pieces that make it:
# (path, first line, last line) of a byte-string literal (Python literals
# may span several lines; Rust ones are one literal starting on the line),
# or the path of a whole file.
VECTORS = [
    ("transformer/testdata/upstream/f32-zeros-2x2.safetensors", SAFETENSORS,
     "test_pt_comparison.py TorchTestCase.test_in_memory: save() of a 2x2 float32 zero tensor",
     [(ST_PT, 233, 234)]),
    ("transformer/testdata/upstream/i32-2x2.safetensors", SAFETENSORS,
     "tensor.rs test_deserialization: a 2x2 I32 tensor that must load",
     [(ST_RS, 1384, 1384)]),
    ("transformer/testdata/upstream/i32-scalar.safetensors", SAFETENSORS,
     "tensor.rs test_empty_shapes_allowed: shape [] must load",
     [(ST_RS, 1371, 1371)]),
    ("transformer/testdata/upstream/metadata.safetensors", SAFETENSORS,
     "test_simple.py test_deserialization_metadata: __metadata__ {framework: pt}",
     [(ST_PY, 67, 68)]),
    ("transformer/testdata/upstream/bf16-2x2.safetensors", SAFETENSORS,
     "test_pt_comparison.py test_serialization: a 2x2 bfloat16 tensor",
     [(ST_PT, 58, 58)]),
    ("transformer/testdata/upstream/bad-polyglot.safetensors", SAFETENSORS,
     "tensor.rs test_metadata_incomplete_buffer: bytes after the tensors must be refused",
     [(ST_RS, 1457, 1457)]),
    ("transformer/testdata/upstream/bad-missing-2-bytes.safetensors", SAFETENSORS,
     "tensor.rs test_metadata_incomplete_buffer: data 2 bytes short must be refused",
     [(ST_RS, 1467, 1467)]),
    ("transformer/testdata/upstream/bad-header-too-large.safetensors", SAFETENSORS,
     "tensor.rs test_header_too_large",
     [(ST_RS, 1479, 1479)]),
    ("transformer/testdata/upstream/bad-empty.safetensors", SAFETENSORS,
     "tensor.rs test_header_too_small: an empty file",
     [(ST_RS, 1491, 1491)]),
    ("transformer/testdata/upstream/bad-header-length-only.safetensors", SAFETENSORS,
     "tensor.rs test_invalid_header_length: a length and no header",
     [(ST_RS, 1502, 1502)]),
    ("metrics/testdata/upstream/file-version.tfevents", TENSORBOARD,
     "tf_record.rs TfRecordReader::read_record doc example: the file_version record of a real event file",
     [(TB_REC, 223, 223), (TB_REC, 224, 224), (TB_REC, 225, 225), (TB_REC, 237, 237)]),
    ("metrics/testdata/upstream/tf2-scalar.tfevents", TENSORBOARD,
     "tf_record.rs test_success: event file of tf.summary.scalar(\"accuracy\", 0.99, step=77)",
     [(TB_REC, 316, 316), (TB_REC, 318, 318), (TB_REC, 320, 320), (TB_REC, 304, 304),
      (TB_REC, 305, 305), (TB_REC, 324, 324), (TB_REC, 325, 325), (TB_REC, 331, 331),
      (TB_REC, 306, 312), (TB_REC, 333, 333)]),
    ("metrics/testdata/upstream/bad-length-crc.tfevents", TENSORBOARD,
     "tf_record.rs test_length_crc_mismatch",
     [(TB_REC, 372, 372), (TB_REC, 373, 373), (TB_REC, 374, 374), (TB_REC, 375, 375)]),
    ("metrics/testdata/upstream/bad-data-crc.tfevents", TENSORBOARD,
     "tf_record.rs test_data_crc_mismatch",
     [(TB_REC, 390, 390), (TB_REC, 391, 391), (TB_REC, 392, 392), (TB_REC, 393, 393)]),
    ("metrics/testdata/upstream/descriptor.bin", TENSORBOARD,
     "the FileDescriptorSet of TensorBoard's protos (Event, Summary, TensorProto, ...) that its data server decodes with",
     "tensorboard/data/server/descriptor.bin"),
    ("metrics/testdata/upstream/crc-zeros.bin", TENSORBOARD,
     "masked_crc.rs test_compute: 32 zero bytes (RFC 3720 B.4), masked CRC32C mask(0x8a9136aa)",
     None),
    ("metrics/testdata/upstream/crc-file-version.bin", TENSORBOARD,
     "masked_crc.rs test_compute: a file_version event, masked CRC32C 0x5794d08a",
     [(TB_CRC, 79, 79)]),
]


def rust_bytes(src):
    """Decode the first Rust byte-string literal b"..." in src."""
    i = src.index('b"') + 2
    out = bytearray()
    while True:
        c = src[i]
        if c == '"':
            return bytes(out)
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        e = src[i + 1]
        if e == "x":
            out.append(int(src[i + 2:i + 4], 16))
            i += 4
        elif e == "\n":  # line continuation: skip the newline and indentation
            i += 2
            while src[i] in " \t\n":
                i += 1
        else:
            out += {"n": b"\n", "r": b"\r", "t": b"\t", "0": b"\0", "\\": b"\\",
                    '"': b'"', "'": b"'"}[e]
            i += 2


def python_bytes(src):
    """Decode the adjacent Python bytes literals on the given lines."""
    parts = []
    for line in src.splitlines():
        s = line.strip().rstrip(",")
        if s.startswith("b'") or s.startswith('b"'):
            parts.append(ast.literal_eval(s))
    if not parts:
        raise ValueError("no bytes literal in %r" % src)
    return b"".join(parts)


def piece(gitdir, commit, path, first, last):
    text = subprocess.run(["git", "--git-dir", gitdir, "show", "%s:%s" % (commit, path)],
                          check=True, capture_output=True, text=True).stdout
    lines = text.splitlines(keepends=True)[first - 1:]
    if path.endswith(".py"):
        return python_bytes("".join(lines[:last - first + 1]))
    return rust_bytes("".join(lines))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: extract.py SAFETENSORS_GIT_DIR TENSORBOARD_GIT_DIR")
    gitdirs = {SAFETENSORS: sys.argv[1], TENSORBOARD: sys.argv[2]}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = []
    for out, (repo, commit), what, pieces in VECTORS:
        if pieces is None:
            data = bytes(32)  # the literal is `[0; 32]`, not a byte string
            where = "%s:73-75" % TB_CRC
        elif isinstance(pieces, str):
            data = subprocess.run(["git", "--git-dir", gitdirs[(repo, commit)], "show",
                                   "%s:%s" % (commit, pieces)], check=True, capture_output=True).stdout
            where = pieces
        else:
            data = b"".join(piece(gitdirs[(repo, commit)], commit, *p) for p in pieces)
            where = ", ".join("%s:%d" % (p[0], p[1]) if p[1] == p[2] else "%s:%d-%d" % p
                              for p in pieces)
        path = os.path.join(root, out)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        rows.append("| `%s` | %d | %s@%s `%s` | %s |" % (out, len(data), repo, commit[:10], where, what))
    with open(os.path.join(root, "test/interop/UPSTREAM.md"), "w") as f:
        f.write("""# Test vectors from the formats' own projects

Made by `python3 test/interop/extract.py SAFETENSORS_GIT_DIR TENSORBOARD_GIT_DIR`
from the byte strings that the upstream test suites assert, at the commits named
below. Both projects are under the Apache License 2.0; the files are their test
data, unchanged. The Go tests that read them are
transformer/safetensors_upstream_test.go and metrics/tfevents_upstream_test.go.

| file | bytes | source | what upstream asserts |
|---|---|---|---|
""")
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
