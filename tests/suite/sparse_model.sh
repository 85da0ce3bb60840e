#!/bin/sh
# sparse_model.sh - ds4-mkmodel --sparse-experts N: the experts left out are
# holes (the file's allocated size well below its apparent size, where the
# filesystem keeps sparse files), the file says which experts it kept, and
# the engine runs it with routing that only ever reaches kept experts: an
# importance matrix collected over random tokens (the sum of each expert's
# squared inputs) is zero for every other expert.  With N = the experts used
# every layer uses exactly its kept experts; with more, hash layers spread
# tokens over all of them.  The MTP block is kept sparse too, and drafts.
# A count below the experts used is refused.  CPU backend, the small preset.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/sparse_model.lock}"
for p in ds4-mkmodel ds4-gguf ds4-imatrix ds4-bench; do [ -x "./$p" ] || make -s "$p"; done
command -v python3 >/dev/null 2>&1 || skip "python3 not found"
dir=build/suite/sparse_model
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "sparse_model: FAIL: $*" >&2; exit 1; }

# 48 prompts of 12 random token ids (the small preset: vocabulary 1024)
python3 - "$dir/ds.txt" <<'EOF'
import random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(48):
        f.write("===== DS4_IMATRIX_PROMPT %d ids\n" % i)
        f.write(" ".join(str(r.randrange(1024)) for _ in range(12)) + "\n\n")
EOF

# check N MODEL: the experts an imatrix saw in each layer against the file's
# kept lists (ds4.mkmodel.sparse_kept: a row of N per layer, then the MTP's).
check() {
    n=$1 m=$2
    ./ds4-imatrix "$m" --backend cpu --ctx 64 -t 2 --imatrix-dataset "$dir/ds.txt" \
        --imatrix-out "$m.dat" 2> "$dir/err.txt" || fail "imatrix of $m: $(cat "$dir/err.txt")"
    ./ds4-gguf info --json --full "$m" > "$m.json"
    python3 - "$n" "$m.json" "$m.dat" <<'EOF' || fail "routing of $m"
import json, struct, sys
n, info, dat = int(sys.argv[1]), json.load(open(sys.argv[2])), open(sys.argv[3], "rb").read()
meta = info["metadata"]
meta = {kv["key"]: kv["value"] for kv in meta} if isinstance(meta, list) else meta
kept, E = meta["ds4.mkmodel.sparse_kept"], meta["deepseek4.expert_count"]
used_k, hash_layers = meta["deepseek4.expert_used_count"], meta["deepseek4.hash_layer_count"]
L = meta["deepseek4.block_count"]
assert meta["ds4.mkmodel.sparse_experts"] == n and len(kept) == (L + 1) * n, "kept list"
seen, off = {}, 4
for _ in range(struct.unpack_from("<i", dat, 0)[0]):
    ln, = struct.unpack_from("<i", dat, off); name = dat[off + 4:off + 4 + ln].decode(); off += 4 + ln
    ncall, nval = struct.unpack_from("<ii", dat, off); off += 8
    vals = struct.unpack_from("<%df" % nval, dat, off); off += 4 * nval
    row = nval // E
    seen[name] = {e for e in range(E) if any(vals[e * row:(e + 1) * row])}
for il in range(L):
    want = set(kept[il * n:(il + 1) * n])
    for t in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        got = seen["blk.%d.%s.weight" % (il, t)]
        if not got <= want: sys.exit("layer %d %s: experts %s are not kept %s" % (il, t, sorted(got - want), sorted(want)))
        if il < hash_layers or n == used_k:
            if got != want: sys.exit("layer %d %s: used %s, kept %s" % (il, t, sorted(got), sorted(want)))
        elif len(got) < used_k: sys.exit("layer %d %s: only %s used" % (il, t, sorted(got)))
EOF
}

# N = the experts used (4): every layer uses exactly its kept experts.
M=$dir/s4.gguf
./ds4-mkmodel -q --preset small --recipe q2 --seed 3 --sparse-experts 4 -o "$M" --mtp "$dir/s4-mtp.gguf"
check 4 "$M"
./ds4-bench -m "$M" --backend cpu --mtp "$dir/s4-mtp.gguf" --mtp-draft 2 --ctx-start 16 --ctx-max 16 \
    --gen-tokens 3 > /dev/null 2> "$dir/err.txt" || fail "MTP run: $(cat "$dir/err.txt")"

# N = 7: hash layers route over all 7, the biased top-4 stays among them.
./ds4-mkmodel -q --preset small --recipe q2 --seed 3 --sparse-experts 7 -o "$dir/s7.gguf"
check 7 "$dir/s7.gguf"

# Holes: 12 of 16 experts left out of a file mostly made of experts.
probe=$dir/probe
truncate -s 8M "$probe"
if [ "$(stat -c %b "$probe")" -ne 0 ]; then
    skip "this filesystem stores holes as data (the routing checks passed)"
fi
apparent=$(stat -c %s "$M")
allocated=$(($(stat -c %b "$M") * $(stat -c %B "$M")))
[ $((allocated * 10)) -lt $((apparent * 7)) ] || fail "allocated $allocated of $apparent bytes: no holes"

# Refused: fewer than the experts used, more than the experts.
if ./ds4-mkmodel -q --preset small --sparse-experts 3 -o "$dir/x.gguf" 2> "$dir/err.txt"; then
    fail "--sparse-experts 3 of 4 used accepted"
fi
grep -q "must be between the experts used (4) and the experts (16)" "$dir/err.txt" || fail "$(cat "$dir/err.txt")"
[ ! -e "$dir/x.gguf" ] || fail "a refused run left a file"
rm -rf "$dir"
echo "sparse_model: ok"
