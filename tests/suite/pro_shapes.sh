#!/bin/sh
# pro_shapes.sh - the published shapes as presets (docs/MODEL.md 1.3): a
# header-only Pro file (and Flash's) written by ds4-mkmodel is accepted by
# ds4 --inspect, named, and its memory estimate equals the formula of
# tests/reference/memory_formula.py (written from the architecture, not from
# the engine's tensor table); its metadata equals the Pro config of an
# independent reference (nano-deepseek-v4); normal loading refuses a file
# without data, saying what it is.
set -u
cd "$(dirname "$0")/../.."
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/pro_shapes.lock}"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for shape in pro flash; do
    for recipe in q2 q4; do
        ./ds4-mkmodel -q --preset $shape --recipe $recipe --header-only -o "$T/$shape.gguf" || fail "mkmodel $shape"
        size=$(wc -c < "$T/$shape.gguf")
        [ "$size" -lt 1000000 ] || fail "$shape header-only file has $size bytes"
        ./ds4 -m "$T/$shape.gguf" --inspect -c 65536 > "$T/inspect.txt" 2>&1 || { cat "$T/inspect.txt"; fail "inspect $shape"; }
        case $shape in pro) name="DeepSeek V4 Pro";; flash) name="DeepSeek V4 Flash";; esac
        grep -q "config ($name)" "$T/inspect.txt" || fail "$shape not named $name: $(grep config "$T/inspect.txt")"
        grep -E '^(weights|kv)_bytes:' "$T/inspect.txt" > "$T/got.txt"
        python3 tests/reference/memory_formula.py $shape $recipe 65536 > "$T/want.txt" || fail "formula"
        cmp -s "$T/got.txt" "$T/want.txt" || fail "$shape $recipe memory: ds4 says $(tr '\n' ' ' < "$T/got.txt"), formula $(tr '\n' ' ' < "$T/want.txt")"
        echo "ok: $shape $recipe header: $(grep '^memory:' "$T/inspect.txt")"
    done
done

# Pro's metadata as nano-deepseek-v4 0.2.0's Pro config gives it
# (tests/golden/tools/pro_config.json, tests/reference/pro_config.py).
./ds4-mkmodel -q --preset pro --recipe q2 --header-only -o "$T/pro.gguf" || fail "mkmodel pro"
./ds4-gguf info --json --full "$T/pro.gguf" > "$T/pro.json" || fail "ds4-gguf info of a header-only file"
python3 - "$T/pro.json" tests/golden/tools/pro_config.json <<'PY' || fail "Pro's metadata differs from the reference config"
import json, sys
got = {kv["key"]: kv["value"] for kv in json.load(open(sys.argv[1]))["metadata"]}
want = json.load(open(sys.argv[2]))
bad = [k for k, v in want.items() if not (abs(got.get(k, -1e30) - v) <= 1e-6 * abs(v) if isinstance(v, float)
                                          else got.get(k) == v)]
if bad:
    sys.exit("differ: " + ", ".join(f"{k} = {got.get(k)} (reference {want[k]})" for k in bad))
print(f"ok: Pro's {len(want)} shape keys equal nano-deepseek-v4's Pro config")
PY

./ds4-forward "$T/pro.gguf" --random 4 --top 0 > "$T/out.txt" 2>&1 && fail "a header-only file ran"
grep -q "header-only file" "$T/out.txt" || fail "message for a header-only file: $(cat "$T/out.txt")"
echo "ok: $(cat "$T/out.txt")"
exit 0
