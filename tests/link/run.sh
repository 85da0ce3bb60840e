#!/bin/sh
# run.sh - the pipeline across a real network link (`make test-dist-link`;
# docs/DISTRIBUTED.md 5, docs/PERFORMANCE.md "Pipeline over a link").
#
# Two network namespaces joined by a veth pair, made and removed here:
# mpirun and rank 0 in one, rank 1 in the other, so the residuals and the
# tokens cross the link between them and nothing else (the launcher's own
# channel, used at the job's start and end, is carried around the link by
# tests/link/pmix_fwd.py; every run checks that rank 0's side of the link
# sent at least the residuals' bytes).  For each link - the bare veth pair,
# then one-way delays of 0.05, 1, 10 and 50 ms, then a 1 Gb/s rate - it
# measures the link (tests/link/probe.py) and a 2-rank pipeline's prefill
# and greedy-decode tokens/s on a model whose residual is the real one's
# (n_embd 4096: 64 KiB a token in f32), checks that the tokens are one
# process's, and prints the cost model's prediction beside each measurement:
#   decode  t = t_model + 2 x latency + residual bytes / bandwidth
#           (one hop down with the residual, one back with the token)
#   prefill t = (chunks + 1) x max(half the model's chunk time, chunk bytes /
#           bandwidth) + latency       (two stages, chunks in flight)
# where t_model is one process's time for the whole model.  The table goes
# to stdout and to build/link/results.txt.
#
# The delays are `tc netem` on the veth pair where the kernel has the netem
# qdisc (sch_netem).  Without it they are a relay in user space: a TUN device
# in each namespace (MTU 64000, so that a residual is one or two packets) and
# tests/link/relay.py between them, the veth pair down meanwhile; the relay
# at delay 0 is measured first (the row "relay"), as its own cost is in
# every delayed row.  The first line printed names the kind of link.
#
# Needs root (namespaces, tc), ip, tc, mpirun and python3: SKIP otherwise.
# A kernel with neither netem nor TUN devices runs the bare link and the
# rate-limited one (tbf) and ends with SKIP for the delays.  The link is
# also cut mid-decode: every rank must end inside 10 s, naming the cause.
set -u
cd "$(dirname "$0")/../.."

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces and tc)"
for t in ip tc mpirun python3; do command -v $t > /dev/null 2>&1 || skip "$t is not installed"; done
[ -x ./ds4-forward ] && [ -x ./ds4-mkmodel ] || fail "build first (make)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export DS4_LOCK_FILE="$PWD/build/link/lock"
OUT=build/link
mkdir -p "$OUT"
A=ds4lnkA$$
B=ds4lnkB$$
VA=d4a$$
VB=d4b$$
TA=d4ta$$
TB=d4tb$$
IPA=10.213.77.1
IPB=10.213.77.2
TIPA=10.213.78.1
TIPB=10.213.78.2
relay=

relay_stop() {
    [ -n "$relay" ] || return 0
    kill "$relay"
    wait "$relay" 2> /dev/null
    relay=
}
cleanup() {
    relay_stop
    ip netns del "$A" 2> /dev/null
    ip netns del "$B" 2> /dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$A" && ip netns add "$B" || skip "cannot make network namespaces here"
ip link add "$VA" type veth peer name "$VB" || skip "cannot make a veth pair here"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || fail "moving the veth ends"
ip -n "$A" addr add $IPA/24 dev "$VA" && ip -n "$B" addr add $IPB/24 dev "$VB" || fail "addresses"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || fail "links up"

# the delays' kind: netem, else the relay over a TUN pair, else none
kind=netem
if ip netns exec "$A" tc qdisc add dev "$VA" root netem delay 1ms 2> /dev/null; then
    ip netns exec "$A" tc qdisc del dev "$VA" root
elif ip -n "$A" tuntap add dev "$TA" mode tun 2> /dev/null && ip -n "$B" tuntap add dev "$TB" mode tun; then
    kind=relay
    ip -n "$A" addr add $TIPA/24 dev "$TA" && ip -n "$B" addr add $TIPB/24 dev "$TB" || fail "TUN addresses"
    for side in "$A $TA" "$B $TB"; do
        ip -n "${side% *}" link set "${side#* }" mtu 64000 up || fail "TUN link up"
    done
else
    kind=none
fi
RES=$OUT/results.txt
echo "link: veth pair; delays by $kind$([ $kind = relay ] && echo " (tests/link/relay.py over a TUN pair)")" | tee "$RES"

# the link the runs use: rank 0's device and the two addresses
use_link() { # use_link veth | tun
    case $1 in
    veth) dev=$VA; ipa=$IPA; ipb=$IPB ;;
    tun) dev=$TA; ipa=$TIPA; ipb=$TIPB ;;
    esac
}
use_link veth

# the TUN pair with MS each way; the veth pair down, so that nothing goes around the relay
relay_start() { # relay_start MS
    relay_stop
    ip -n "$A" link set "$VA" down
    rm -f "$OUT/relay.log"
    python3 tests/link/relay.py "$1" /run/netns/"$A" "$TA" /run/netns/"$B" "$TB" > "$OUT/relay.log" 2>&1 &
    relay=$!
    i=0; while ! grep -q ready "$OUT/relay.log" 2> /dev/null; do
        i=$((i + 1)); [ $i -lt 100 ] || fail "the relay did not start: $(cat "$OUT/relay.log")"; sleep 0.05
    done
    use_link tun
}

# the link: both directions shaped alike
shape() { # shape none | delay MS | relay MS | rate MBIT
    ip netns exec "$A" tc qdisc del dev "$VA" root 2> /dev/null
    ip netns exec "$B" tc qdisc del dev "$VB" root 2> /dev/null
    case $1 in
    relay) relay_start "$2"; return ;;
    esac
    relay_stop
    ip -n "$A" link set "$VA" up || fail "veth up"
    use_link veth
    case $1 in
    none) ;;
    delay) for side in "$A $VA" "$B $VB"; do
               ip netns exec "${side% *}" tc qdisc add dev "${side#* }" root netem delay "${2}ms" limit 100000 ||
                   fail "netem delay $2 ms"
           done ;;
    rate) for side in "$A $VA" "$B $VB"; do
              ip netns exec "${side% *}" tc qdisc add dev "${side#* }" root tbf rate "${2}mbit" burst 256kb \
                  latency 500ms || fail "tbf rate $2 mbit"
          done ;;
    esac
}

probe() { # the link's round trip in ms and bandwidth in MB/s: $rtt, $mbps
    port=$((20000 + $$ % 20000))
    rm -f "$OUT/probe.log"
    timeout 60 ip netns exec "$B" python3 tests/link/probe.py serve $port > "$OUT/probe.log" 2>&1 &
    pp=$!
    i=0; while ! grep -q ready "$OUT/probe.log" 2> /dev/null; do i=$((i + 1)); [ $i -lt 100 ] || fail "probe"; sleep 0.05; done
    timeout 60 ip netns exec "$A" python3 tests/link/probe.py measure "$ipb" $port > "$OUT/link.txt" ||
        fail "the link probe failed: $(tail -1 "$OUT/probe.log")"
    wait $pp
    read -r rtt mbps < "$OUT/link.txt"
}

# the model: the real residual width, few layers, greedy decoding
M=$OUT/wide.gguf
[ -f "$M" ] || ./ds4-mkmodel --preset small --set embd=4096 --set layers=4 --recipe q8_0 --random-blocks -q \
    -o "$M" || fail "mkmodel"
P=512; C=64; G=64
RUN="--random $P --chunk $C --bench --gen $G --top 0 -t 1 -c 1024"
rate_of() { sed -n "s/^$1.* = \([0-9.]*\) tokens\/s/\1/p" "$2"; }
# one process, run next to each pipeline run: the model's compute time is
# measured under the machine's load of that moment
baseline() {
    # shellcheck disable=SC2086
    ip netns exec "$A" ./ds4-forward "$M" $RUN > "$OUT/one.txt" 2> /dev/null || fail "one process"
    pre1=$(rate_of prefill "$OUT/one.txt"); dec1=$(rate_of "decode (greedy)" "$OUT/one.txt")
}

# rank 1's wrapper: in namespace B, the forwarder to mpirun's loopback in A
cat > "$OUT/in_b.sh" << EOF
#!/bin/sh
port=\${PMIX_SERVER_URI41##*:}
python3 tests/link/pmix_fwd.py "\$port" /run/netns/$A > "$OUT/fwd.\$\$.log" 2>&1 &
fp=\$!
while ! grep -q ready "$OUT/fwd.\$\$.log" 2> /dev/null; do sleep 0.05; done
"\$@"
rc=\$?
kill \$fp
rm -f "$OUT/fwd.\$\$.log"
exit \$rc
EOF
chmod +x "$OUT/in_b.sh"

sent() { ip netns exec "$A" cat /sys/class/net/"$dev"/statistics/tx_bytes; }
pipeline() { # the 2-rank run's output in $OUT/two.txt
    tx0=$(sent)
    # shellcheck disable=SC2086
    timeout 600 ip netns exec "$A" mpirun --oversubscribe --bind-to none --mca btl self,tcp \
        --mca btl_tcp_if_include $ipa/24 -np 1 ./ds4-forward "$M" $RUN --layers 0:1 \
        : -np 1 ip netns exec "$B" "$OUT/in_b.sh" ./ds4-forward "$M" -t 1 --layers 2:output \
        > "$OUT/two.txt" 2> "$OUT/two.err" || fail "the pipeline over the link: $(tail -5 "$OUT/two.err")"
    [ "$(grep 'greedy tokens' "$OUT/two.txt")" = "$(grep 'greedy tokens' "$OUT/one.txt")" ] ||
        fail "the pipeline's tokens differ from one process's"
    # the prefill's residuals and the decode's, 64 KiB each, left by this link
    tx=$(($(sent) - tx0)); need=$(((P + G - 1) * 65536))
    [ $tx -ge $need ] || fail "rank 0's side of $dev sent $tx bytes, the residuals are $need: they went around the link"
}

printf '%-10s %8s %7s | %9s | %9s %9s | %9s | %9s %9s\n' link rtt_ms MB/s "1 prefill" "2 prefill" model \
    "1 decode" "2 decode" model | tee -a "$RES"
measure() { # measure NAME SHAPE...: the link, one process, the pipeline, the model
    name=$1; shift
    shape "$@"
    probe
    case $name in *Gb/s*) mbps=$(awk -v r="${name%% *}" 'BEGIN { print r * 125 }') ;; esac
    baseline
    pipeline
    pre2=$(rate_of prefill "$OUT/two.txt"); dec2=$(rate_of "decode (greedy)" "$OUT/two.txt")
    awk -v name="$name" -v rtt="$rtt" -v mbps="$mbps" -v pre1="$pre1" -v dec1="$dec1" -v pre2="$pre2" \
        -v dec2="$dec2" -v P=$P -v C=$C 'BEGIN {
        lat = rtt / 2 / 1e3; bw = mbps * 1e6; bytes = 4 * 4 * 4096
        tdec = 1 / dec1 + 2 * lat + bytes / bw
        half = C / pre1 / 2; wire = C * bytes / bw; s = half > wire ? half : wire
        tpre = (P / C + 1) * s + lat
        printf "%-10s %8.3f %7.0f | %9.1f | %9.1f %9.1f | %9.2f | %9.2f %9.2f\n", name, rtt, mbps, pre1, pre2, \
               P / tpre, dec1, dec2, 1 / tdec
    }' | tee -a "$RES"
}
measure "veth" none

# a link that breaks mid-decode: every rank ends inside 10 s, the cause named
shape none
# shellcheck disable=SC2086
timeout 120 ip netns exec "$A" mpirun --oversubscribe --bind-to none --mca btl self,tcp \
    --mca btl_tcp_if_include $IPA/24 -np 1 ./ds4-forward "$M" --random 16 --bench --gen 100000 --top 0 -t 1 \
    -c 120000 --layers 0:1 : -np 1 ip netns exec "$B" "$OUT/in_b.sh" ./ds4-forward "$M" -t 1 --layers 2:output \
    > "$OUT/cut.txt" 2>&1 &
job=$!
i=0; while ! grep -q "pipeline stage 1" "$OUT/cut.txt" 2> /dev/null; do i=$((i + 1)); [ $i -lt 600 ] || fail "cut: no start"; sleep 0.1; done
sleep 3
t0=$(date +%s%N)
ip -n "$A" link set "$VA" down
i=0
while kill -0 $job 2> /dev/null; do
    i=$((i + 1)); [ $i -lt 200 ] || { kill $job; fail "the job still runs 20 s after the link broke"; }; sleep 0.1
done
wait $job
ms=$((($(date +%s%N) - t0) / 1000000))
ip -n "$A" link set "$VA" up
[ $ms -lt 10000 ] || fail "the ranks took $ms ms to stop after the link broke"
grep -q "rank 1 .*sent nothing" "$OUT/cut.txt" || fail "the link's break is not named: $(tail -5 "$OUT/cut.txt")"
echo "ok: the link broke mid-decode, every rank ended in $ms ms: $(grep -m1 'pipeline failed' "$OUT/cut.txt")"
# a decode token pays the link's round trip once: its residual goes at
# once, not after the receiver's answer (the eager limit, dist_comm.c).  On
# the longest delay the pipeline's token beyond one process's is under 1.5
# round trips, whatever the machine's load adds.
one_round_trip() {
    awk -v rtt="$rtt" -v dec1="$dec1" -v dec2="$dec2" 'BEGIN { exit !(1e3 / dec2 - 1e3 / dec1 < 1.5 * rtt) }' ||
        fail "a decode token took $(awk -v a="$dec1" -v b="$dec2" 'BEGIN { printf "%.1f", 1e3 / b - 1e3 / a }') ms" \
            "more than one process's on a link of $rtt ms round trip: more than one round trip a token"
}
case $kind in
netem) for d in 0.05 1 10 50; do measure "+${d} ms" delay $d; done ;;
relay) measure "relay" relay 0
       for d in 0.05 1 10 50; do measure "+${d} ms" relay $d; done ;;
esac
[ $kind = none ] || one_round_trip
measure "1 Gb/s" rate 1000
if [ $kind = none ]; then
    skip "the kernel has neither the netem qdisc (sch_netem) nor TUN devices: the delays 0.05, 1, 10, 50 ms were not measured (the bare and the 1 Gb/s link were: $RES)"
fi
exit 0
