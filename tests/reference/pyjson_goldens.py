#!/usr/bin/env python3
"""pyjson_goldens.py - what Python's json.dumps(ensure_ascii=False) writes, for
src/text/pyjson.c (the official DeepSeek V4 encoder serialises tool schemas and
arguments that way).  Writes tests/golden/text/pyjson.txt:

  float HEXBITS REPR     a double (IEEE bits, hex) and json.dumps of it
  dump JSON_IN DUMPED    json.dumps(json.loads(JSON_IN)), both JSON-escaped on one line

Usage: tests/reference/pyjson_goldens.py [--out PATH]
"""
import argparse
import json
import math
import os
import random
import struct

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def floats():
    rng = random.Random(99)
    vals = [0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 2.5, 1e-05, 1e-4, 1e-5, 0.0001, 0.00001234, 1e15, 1e16, 1e17, 1e22,
            123456789012345678.0, 9007199254740993.0, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
            3.141592653589793, 100.0, 1234567.0, 0.3, 2 / 3, 1e-7, 1.5e-7, 9.999999999999999e15, 1e300]
    for _ in range(1500):
        k = rng.random()
        if k < 0.4:
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if math.isnan(x) or math.isinf(x):
                continue
        elif k < 0.7:
            x = rng.uniform(-1, 1) * 10 ** rng.randint(-20, 20)
        else:
            x = round(rng.uniform(-1000, 1000), rng.randint(0, 6))
        vals.append(x)
    return vals


DUMPS = [
    '{"a": 1, "b": [true, false, null], "c": {"d": "e"}}',
    '{"ctl": "\\u0000\\u0001\\u001f\\b\\f\\n\\r\\t\\u007f", "q": "\\"\\\\/"}',
    '{"unicode": "caffè 中文 😀 \\u2028\\u2029 \\ufeff", "key with spaces": []}',
    '{"nested": [[], {}, [1, [2, [3]]], {"x": {"y": {}}}], "num": -0, "big": 9007199254740993}',
    '{"dup": 1, "other": 2, "dup": 3}',
    '[1.0, 2.50, -0.0, 1e400e0]'.replace("1e400e0", "1E-7"),
    # Numbers jansson cannot hold: exact big integers, overflowing reals.
    '{"id": 123456789012345678901234567890, "neg": -98765432109876543210, "edge": 9223372036854775808,'
    ' "min": -9223372036854775808, "max": 9223372036854775807}',
    '{"huge": 1e400, "tiny": -1E+400, "small": 1e-400, "nan": NaN, "inf": [Infinity, -Infinity]}',
    '[18446744073709551616, {"k": [1' + '0' * 400 + ']}, 1.5e308, 17976931348623157e292]',
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "text", "pyjson.txt"))
    args = ap.parse_args()
    lines = ["# json.dumps(ensure_ascii=False) goldens, written by tests/reference/pyjson_goldens.py"]
    for x in floats():
        lines.append(f"float {struct.unpack('<Q', struct.pack('<d', x))[0]:016x} {json.dumps(x)}")
    for d in DUMPS:
        lines.append(f"dump {json.dumps(d)} {json.dumps(json.dumps(json.loads(d), ensure_ascii=False))}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{args.out}: {len(lines)} lines")


if __name__ == "__main__":
    main()
