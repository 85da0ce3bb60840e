#!/bin/sh
# gguf_tool.sh - `ds4-gguf info` on the committed golden files: the text
# listing shows metadata (arrays shortened) and the tensor table, --json is
# valid JSON with the same content, and a corrupt file exits 1 with the
# reader's message naming the offset.
set -eu
cd "$(dirname "$0")/../.."
[ -x ./ds4-gguf ] || make -s ds4-gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g=tests/golden/gguf/ds4writer.gguf
fail() { echo "FAIL: $*"; exit 1; }

./ds4-gguf info "$g" >"$tmp/text"
grep -q "GGUF v3, 2880 bytes, alignment 64, data section at offset 2048" "$tmp/text" || fail "header line"
grep -Eq '^  test\.arr\.str +str\[4\] +\["a", "", "ünïcödé", "tab\\tnl\\n"\]$' "$tmp/text" || fail "string array"
grep -Eq '^  test\.str_raw +str +"\\xff\\xfe\\x00raw\\x80"$' "$tmp/text" || fail "raw string"
grep -Eq '^  t\.q8_0 +q8_0 +\[32\] +34 bytes  at 128$' "$tmp/text" || fail "tensor row"
grep -Eq '^  t\.maxdims +f32 +\[2, 1, 1, 1, 1, 1, 1, 3\] +24 bytes  at 768$' "$tmp/text" || fail "8-dim tensor"

# A long array is shortened unless --full.
python3 - "$tmp/long.gguf" <<'PY'
import struct, sys
key = b"long"
d = struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + struct.pack("<Q", len(key)) + key
d += struct.pack("<IIQ", 9, 4, 20) + struct.pack("<20I", *range(100, 120))
open(sys.argv[1], "wb").write(d)
PY
./ds4-gguf info "$tmp/long.gguf" | grep -Eq '^  long +u32\[20\] +\[100, 101, 102, 103, 104, 105, 106, 107, \.\.\. 12 more\]$' \
    || fail "shortened array"
./ds4-gguf info --full "$tmp/long.gguf" | grep -q ', 118, 119\]$' || fail "--full array"
./ds4-gguf info --json "$tmp/long.gguf" | grep -q '"count": 20, "truncated": true, "value": \[100, 101, 102, 103, 104, 105, 106, 107\]' \
    || fail "json truncated array"

./ds4-gguf info --json "$g" >"$tmp/json"
python3 - "$tmp/json" <<'PY' || fail "json content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["version"] == 3 and d["alignment"] == 64 and d["data_offset"] == 2048, d
kv = {m["key"]: m for m in d["metadata"]}
assert len(d["metadata"]) == 41
assert kv["test.u64"]["value"] == 2**64 - 1
assert kv["test.i64"]["value"] == -2**63
assert kv["test.f64"]["value"] == -2.718281828459045
assert kv["test.f32"]["value"] == 0.1
assert kv["test.str"]["value"] == "h\u00e9llo w\u00f6rld \u2713"
assert kv["test.str_raw"]["value"] == "\ufffd\ufffd\x00raw\ufffd"
assert kv["test.arr.str"]["value"] == ["a", "", "\u00fcn\u00efc\u00f6d\u00e9", "tab\tnl\n"]
assert kv["test.arr.f64"]["value"] == [3.141592653589793, -1e300, 5e-324]
assert kv["test.empty.str"]["count"] == 0 and kv["test.empty.str"]["value"] == []
assert kv["general.alignment"]["value"] == 64
t = {x["name"]: x for x in d["tensors"]}
assert t["t.q4_k"] == {"name": "t.q4_k", "type": "q4_k", "type_id": 12, "dims": [256],
                       "elements": 256, "bytes": 144, "offset": 320}, t["t.q4_k"]
PY

# Corrupt the q8_0 tensor's type id: it follows the name, ndim and one dim.
python3 - "$g" "$tmp/bad.gguf" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
i = d.find(b"t.q8_0") + 6 + 4 + 8   # name, ndim, one dim -> type id
d[i] = 200
open(sys.argv[2], "wb").write(d)
PY
if ./ds4-gguf info "$tmp/bad.gguf" >"$tmp/out" 2>"$tmp/err"; then fail "corrupt file accepted"; fi
grep -Eq "^ds4-gguf: .*bad.gguf: offset [0-9]+: tensor 't.q8_0': unknown tensor type 200$" "$tmp/err" || fail "error message: $(cat "$tmp/err")"
if ./ds4-gguf info >/dev/null 2>&1; then fail "no file accepted"; fi
echo "ds4-gguf info: ok"
