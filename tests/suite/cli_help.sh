#!/bin/sh
# cli_help.sh - the command line conventions every program shares (one
# option table each, base/opts.h): --help prints a synopsis and every option
# with a description (numbers with their range and default) on stdout and
# exits 0; every spelling it lists is one the program accepts; an unknown
# option is refused the same way by all (status 2, "PROG: --x: unknown
# option (see PROG --help)"); test hooks stay out of the help.
set -eu
cd "$(dirname "$0")/../.."
progs="ds4 ds4-server ds4-agent ds4-bench ds4-forward ds4-gguf ds4-imatrix ds4-mkmodel ds4-qeval ds4-quant-bench ds4-score
       ds4-score-compare ds4-splice ds4-tokenizer ds4-quantize ds4-direction ds4-eval"
for p in $progs; do [ -x "./$p" ] || make -s "$p"; done
root=$PWD
dir=$root/build/suite/cli_help
rm -rf "$dir"
mkdir -p "$dir/empty"
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$root/build/test-locks/cli_help.lock}"
fail() { echo "cli_help: FAIL: $*" >&2; exit 1; }

for p in $progs; do
    set +e
    "./$p" --help > "$dir/$p.help" 2> "$dir/$p.err"
    rc=$?
    set -e
    [ $rc -eq 0 ] || fail "$p --help exited $rc"
    [ ! -s "$dir/$p.err" ] || fail "$p --help wrote on stderr: $(cat "$dir/$p.err")"
    head -1 "$dir/$p.help" | grep -q "^usage: $p " || fail "$p --help: no synopsis: $(head -1 "$dir/$p.help")"
    python3 - "$p" "$dir/$p.help" > "$dir/$p.spellings" <<'PY' || fail "$p --help: $(cat "$dir/$p.help")"
import re, sys
prog, path = sys.argv[1], sys.argv[2]
lines = open(path).read().split("\n")
# An option line: two spaces, spellings, an optional value, then the text
# (on the same line from column 27, or on the next line).
rows, i = [], 0
while i < len(lines):
    m = re.match(r"^  (-[^ ].*?)(?:  +(\S.*))?$", lines[i])
    if not m or lines[i].startswith("   "):
        i += 1
        continue
    left, text = m.group(1), m.group(2) or ""
    i += 1
    while i < len(lines) and lines[i].startswith(" " * 27) and lines[i].strip():
        text += " " + lines[i].strip()
        i += 1
    rows.append((left, text))
if not rows:
    sys.exit("%s: no options listed" % prog)
for left, text in rows:
    if not text.strip():
        sys.exit("%s: option %s has no description" % (prog, left))
    parts = left.split(" ")
    value = parts[-1] if not parts[-1].startswith("-") else None
    if value in ("N", "F", "S", "K", "G") and "default" not in text and "required" not in text:
        sys.exit("%s: option %s does not give its default: %s" % (prog, left, text))
    for s in left.replace(",", " ").split():
        if s.startswith("-"):
            print(s)
if "-h" not in open(path).read():
    sys.exit("%s: -h is not listed" % prog)
PY
    # Every listed spelling is one the program knows (run alone, in a
    # directory without a model: nothing heavy starts).
    while read -r s; do
        [ "$s" = "-h" ] || [ "$s" = "--help" ] && continue
        (cd "$dir/empty" && timeout 60 "$root/$p" "$s" < /dev/null > /dev/null 2> "$dir/spelling.err") || true
        if grep -q -- "$s: unknown option" "$dir/spelling.err"; then fail "$p lists $s but refuses it"; fi
    done < "$dir/$p.spellings"
    set +e
    "./$p" --no-such-option > /dev/null 2> "$dir/$p.err"
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "$p --no-such-option exited $rc"
    [ "$(cat "$dir/$p.err")" = "$p: --no-such-option: unknown option (see $p --help)" ] \
        || fail "$p --no-such-option: $(cat "$dir/$p.err")"
done

# The plot script (Python) answers --help too.
python3 tools/ds4-bench-plot.py --help > /dev/null || fail "ds4-bench-plot.py --help"
# The server's test hook works but is not offered to users.
grep -q "test-force-output" "$dir/ds4-server.help" && fail "ds4-server --help lists its test hook"
set +e
./ds4-server --test-force-output > /dev/null 2> "$dir/hook.err"
set -e
grep -q "needs a value" "$dir/hook.err" || fail "ds4-server --test-force-output: $(cat "$dir/hook.err")"
# Both value spellings, and ds4's single-dash long option.
grep -q -- "-sys, --system TEXT" "$dir/ds4.help" || fail "ds4 --help lacks -sys"
echo "cli_help: ok ($(echo $progs | wc -w) programs)"
