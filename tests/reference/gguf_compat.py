#!/usr/bin/env python3
"""gguf_compat.py - GGUF compatibility goldens between ds4 and gguf-py.

Two directions, so that the default C test suite proves compatibility with
gguf-py (PyPI gguf==0.19.0, pinned in tests/reference/requirements.txt)
without needing Python (the goldens were produced and checked with
gguf==0.19.0 and numpy==2.3.4):

  write   GGUFWriter writes tests/golden/gguf/pywriter_a{32,1,256}.gguf: every
          metadata value type, arrays of every element type, one tensor of
          every GGML type in src/format/types.c, at alignments 32 (default),
          1 and 256, and quant_sizes.txt, gguf-py's type geometry.
          tests/unit/test_gguf_golden.c reads them with the ds4
          reader and checks every value and tensor byte against its own copy
          of the content below, and checks that the ds4 writer, fed the same
          content, reproduces each file byte for byte.

  check   GGUFReader reads tests/golden/gguf/ds4writer.gguf, written by the
          ds4 writer (test_gguf_golden --write-golden), and checks its
          metadata and tensor bytes against the content below.  The C test
          checks that the ds4 writer still produces that file byte for byte.

Rerun (from the repository root):

  make venv        # .venv with tests/reference/requirements.txt
  make build/tests/test_gguf_golden
  build/tests/test_gguf_golden --write-golden tests/golden/gguf/ds4writer.gguf
  .venv/bin/python tests/reference/gguf_compat.py write tests/golden/gguf
  .venv/bin/python tests/reference/gguf_compat.py check tests/golden/gguf/ds4writer.gguf

With no arguments the script does both on tests/golden/gguf.  The content
here and in test_gguf_golden.c must stay in step: change both together.
"""
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

V = GGUFValueType
ARCH = "ds4test"

SCALARS = [
    ("test.u8", V.UINT8, 200),
    ("test.i8", V.INT8, -100),
    ("test.u16", V.UINT16, 60000),
    ("test.i16", V.INT16, -30000),
    ("test.u32", V.UINT32, 4000000000),
    ("test.i32", V.INT32, -2000000000),
    ("test.f32", V.FLOAT32, 0.1),
    ("test.bool_true", V.BOOL, True),
    ("test.bool_false", V.BOOL, False),
    ("test.str", V.STRING, "h\u00e9llo w\u00f6rld \u2713".encode()),
    ("test.str_empty", V.STRING, b""),
    ("test.str_raw", V.STRING, b"\xff\xfe\x00raw\x80"),  # not UTF-8: GGUF stores bytes
    ("test.u64", V.UINT64, 2**64 - 1),
    ("test.i64", V.INT64, -(2**63)),
    ("test.f64", V.FLOAT64, -2.718281828459045),
]

ARRAYS = [
    ("test.arr.u8", V.UINT8, [0, 1, 255]),
    ("test.arr.i8", V.INT8, [-128, 0, 127]),
    ("test.arr.u16", V.UINT16, [0, 65535, 1234]),
    ("test.arr.i16", V.INT16, [-32768, 32767]),
    ("test.arr.u32", V.UINT32, [0, 4294967295, 7]),
    ("test.arr.i32", V.INT32, [-2147483648, 2147483647, -1]),
    ("test.arr.f32", V.FLOAT32, [1.0, -0.5, 3.4028234663852886e38, 0.1]),
    ("test.arr.bool", V.BOOL, [True, False, True]),
    ("test.arr.str", V.STRING, [b"a", b"", "\u00fcn\u00efc\u00f6d\u00e9".encode(), b"tab\tnl\n"]),
    ("test.arr.u64", V.UINT64, [0, 2**64 - 1]),
    ("test.arr.i64", V.INT64, [-(2**63), 2**63 - 1, 42]),
    ("test.arr.f64", V.FLOAT64, [3.141592653589793, -1e300, 5e-324]),
]

# Empty arrays of every element type: gguf-py cannot write them, so only the
# ds4-written file has them (GGUFReader reads them).
EMPTY_ARRAYS = [("test.empty." + n, t, []) for n, t in [
    ("u8", V.UINT8), ("i8", V.INT8), ("u16", V.UINT16), ("i16", V.INT16), ("u32", V.UINT32),
    ("i32", V.INT32), ("f32", V.FLOAT32), ("bool", V.BOOL), ("str", V.STRING), ("u64", V.UINT64),
    ("i64", V.INT64), ("f64", V.FLOAT64)]]

# Every type id of the geometry table in src/format/types.c but Q8_1 (9):
# gguf-py sizes its blocks at 40 bytes (two f32 scales, an old layout) where
# GGML's block_q8_1 is 36 (two f16).  Q8_1 is an activation-only type that
# no GGUF file stores; quant_sizes.txt records the difference.
ALL_TYPES = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
             24, 25, 26, 27, 28, 29, 30, 34, 35, 39]
MAXDIMS_SEED = 100


def tensor_shape(type_id):
    """GGUF dims (ne[0] first) of the test tensor of a type."""
    block = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][0]
    ndim = 1 + type_id % 4
    if block == 1:
        ne0 = 1 + type_id % 5
    elif block < 256:
        ne0 = block * (1 + type_id % 2)
    else:
        ne0 = block
    rest = [1 if block >= 256 else 1 + (type_id + i) % 2 for i in range(1, ndim)]
    return [ne0] + rest


def tensor_nbytes(type_id, ne):
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    return int(np.prod(ne)) // block * size


def tensor_bytes(seed, n):
    return bytes((seed * 37 + j * 11 + 3) & 0xFF for j in range(n))


def tensor_specs(type_ids, maxdims):
    """(name, type id, ne, data) for the tensors of a file."""
    out = []
    for t in type_ids:
        ne = tensor_shape(t)
        name = "t." + GGMLQuantizationType(t).name.lower()
        out.append((name, t, ne, tensor_bytes(t, tensor_nbytes(t, ne))))
    if maxdims:
        ne = [2, 1, 1, 1, 1, 1, 1, 3]
        out.append(("t.maxdims", 0, ne, tensor_bytes(MAXDIMS_SEED, tensor_nbytes(0, ne))))
    return out


# The files gguf-py writes: name -> (alignment or None, kv list, tensors).
PY_FILES = {
    "pywriter_a32.gguf": (None, SCALARS + ARRAYS, tensor_specs(ALL_TYPES, True)),
    "pywriter_a1.gguf": (1, [("test.u32", V.UINT32, 7)], tensor_specs([0, 8, 24], False)),
    "pywriter_a256.gguf": (256, [("test.u32", V.UINT32, 7)], tensor_specs([1, 12, 26], False)),
}

# The file the ds4 writer writes (opened with alignment 64, which it stores
# as general.alignment after the other keys).
DS4_ALIGNMENT = 64
DS4_KVS = SCALARS + ARRAYS + EMPTY_ARRAYS
DS4_TENSORS = tensor_specs([0, 1, 8, 10, 12, 16, 26, 30], True)


def write_py_file(path, alignment, kvs, tensors):
    w = GGUFWriter(str(path), ARCH)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, vtype, val in kvs:
        if isinstance(val, list):
            w.add_key_value(key, val, V.ARRAY, sub_type=vtype)
        else:
            w.add_key_value(key, val, vtype)
    for name, type_id, ne, data in tensors:
        byte_shape = list(reversed(ne))
        byte_shape[-1] = len(data) // int(np.prod(byte_shape[:-1]))
        arr = np.frombuffer(data, dtype=np.uint8).reshape(byte_shape)
        w.add_tensor(name, arr, raw_dtype=GGMLQuantizationType(type_id))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ------------------------------------------------------------------ check

PACK = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I",
        V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q",
        V.FLOAT64: "<d"}


def encode(vtype, val):
    """Bytes of one value as GGUF stores it (floats compared bit for bit)."""
    if vtype == V.STRING:
        return val
    return struct.pack(PACK[vtype], val)


def field_elements(field):
    """Raw bytes of each element of a ReaderField (one for scalars)."""
    return [bytes(np.asarray(field.parts[i]).tobytes()) for i in field.data]


def check_kv(reader, key, vtype, val, failures):
    field = reader.get_field(key)
    if field is None:
        failures.append(f"{key}: missing")
        return
    if isinstance(val, list):
        # parts: key len, key, value type, element type, count, elements...
        elem_type = int(field.parts[3][0])
        count = int(field.parts[4][0])
        got = field_elements(field) if count else []
        want = [encode(vtype, x) for x in val]
        if field.types[0] != V.ARRAY or elem_type != vtype or count != len(val) or got != want:
            failures.append(f"{key}: got array of {elem_type} x{count} {got}, want {vtype.name} {want}")
    else:
        got = field_elements(field)
        if field.types != [vtype] or got != [encode(vtype, val)]:
            failures.append(f"{key}: got {field.types} {got}, want {vtype.name} {encode(vtype, val)}")


def check_ds4_file(path):
    reader = GGUFReader(path)
    failures = []
    want_kvs = [("general.architecture", V.STRING, ARCH.encode())] + DS4_KVS + \
               [("general.alignment", V.UINT32, DS4_ALIGNMENT)]
    got_keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    if got_keys != [k for k, _, _ in want_kvs]:
        failures.append(f"keys/order: got {got_keys}")
    for key, vtype, val in want_kvs:
        check_kv(reader, key, vtype, val, failures)
    if reader.alignment != DS4_ALIGNMENT:
        failures.append(f"alignment {reader.alignment}")
    if len(reader.tensors) != len(DS4_TENSORS):
        failures.append(f"{len(reader.tensors)} tensors, want {len(DS4_TENSORS)}")
    for t, (name, type_id, ne, data) in zip(reader.tensors, DS4_TENSORS):
        got = (t.name, int(t.tensor_type), [int(x) for x in t.shape], t.n_bytes, t.data.tobytes())
        if got != (name, type_id, ne, len(data), data):
            failures.append(f"tensor {name}: got {got[:4]}, want {(name, type_id, ne, len(data))}"
                            f"{' (bytes differ)' if got[4] != data else ''}")
        if t.data_offset % DS4_ALIGNMENT:
            failures.append(f"tensor {name}: data offset {t.data_offset} not aligned")
    return failures


def write_quant_sizes(path):
    """gguf-py's block geometry, one type a line: id name block_elems block_bytes."""
    with open(path, "w") as f:
        f.write("# GGML_QUANT_SIZES of gguf-py (tests/reference/gguf_compat.py)\n")
        for t, (block, size) in sorted(GGML_QUANT_SIZES.items()):
            f.write(f"{int(t)} {t.name.lower()} {block} {size}\n")


def main(argv):
    golden = Path("tests/golden/gguf")
    cmd = argv[1] if len(argv) > 1 else "all"
    if cmd in ("write", "all"):
        out = Path(argv[2]) if cmd == "write" and len(argv) > 2 else golden
        out.mkdir(parents=True, exist_ok=True)
        for name, (alignment, kvs, tensors) in PY_FILES.items():
            write_py_file(out / name, alignment, kvs, tensors)
            print(f"wrote {out / name} ({(out / name).stat().st_size} bytes)")
        write_quant_sizes(out / "quant_sizes.txt")
        print(f"wrote {out / 'quant_sizes.txt'}")
    if cmd in ("check", "all"):
        path = Path(argv[2]) if cmd == "check" and len(argv) > 2 else golden / "ds4writer.gguf"
        failures = check_ds4_file(path)
        for f in failures:
            print("FAIL:", f)
        if failures:
            return 1
        print(f"{path}: GGUFReader agrees on {len(DS4_KVS) + 2} keys and {len(DS4_TENSORS)} tensors")
    if cmd not in ("write", "check", "all"):
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
