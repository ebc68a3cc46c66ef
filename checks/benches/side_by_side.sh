#!/usr/bin/env bash
# Instructions and allocations per call, every variant side by side in one
# run (issue 56): the server in a process of its own (the `instructions`
# bench's `serve`), each client under callgrind (`remote`), sequential
# keep-alive calls on loopback. Per call = (count at 1 200 calls − count
# at 200) / 1 000, for instructions (callgrind's `Collected`) and for the
# allocations the bench's counting allocator saw; every variant twice.
#
#   cargo bench -p reqwest-safe-retry-checks --no-default-features \
#       --features default-tls --bench instructions --no-run
#   checks/benches/side_by_side.sh [instructions binary]
#
# The binary defaults to the newest `instructions-*` under
# $CARGO_TARGET_DIR (or ./target)/release/deps. VARIANTS (space-separated)
# replaces the default list; a variant is a chain of the bench's `http`
# mode, or `label=chain@binary` to count another build's chain in the same
# run (a before/after pair). METHODS defaults to "get post"; RUNS to 2;
# SMALL and LARGE to 200 and 1200. With `empty` and `contract-lean` among
# the variants, `reqwest-retry+contract` is reqwest-retry's count plus
# what the contract adds to the empty stack (contract-lean − empty).
set -euo pipefail

target=${CARGO_TARGET_DIR:-target}
bin=${1:-$(ls -t "$target"/release/deps/instructions-* 2>/dev/null | grep -v '\.d$' | head -n1)}
[ -x "$bin" ] || { echo "no instructions binary (build it first: see the header)" >&2; exit 1; }
variants=${VARIANTS:-"bare empty reqwest-retry contract contract-lean retry-floor contract-floor safe-retry safe-retry-no-deadline-header safe-retry-no-deadline"}
methods=${METHODS:-"get post"}
runs=${RUNS:-2}
small=${SMALL:-200}
large=${LARGE:-1200}

out=$(mktemp -d)
"$bin" serve >"$out/url" 2>"$out/server.err" &
server=$!
trap 'kill "$server" 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 100); do [ -s "$out/url" ] && break; sleep 0.05; done
url=$(head -n1 "$out/url")
[ -n "$url" ] || { echo "the server did not start" >&2; exit 1; }

# count <binary> <chain> <method> <calls>: "instructions allocations"
count() {
    local log="$out/run.log"
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$1" remote "$url" "$2" "$3" "$4" >"$out/run.out" 2>"$log"
    local ir allocs
    ir=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$log")
    allocs=$(sed -n 's/^allocations: \([0-9]*\)$/\1/p' "$out/run.out")
    [ -n "$ir" ] && [ -n "$allocs" ] || { cat "$log" "$out/run.out" >&2; exit 1; }
    echo "$ir $allocs"
}

echo "# $(date -u +%FT%TZ) $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || true) binary $bin"
echo "# server: $url (its own process); per call = (at $large − at $small) / $((large - small))"
printf '%-8s %-40s %12s %12s %10s %10s\n' method variant "instr run1" "instr run2" "allocs r1" "allocs r2"
declare -A result
for method in $methods; do
    for variant in $variants; do
        label=${variant%%=*}
        spec=${variant#*=}
        chain=${spec%%@*}
        vbin=$bin
        [ "$spec" != "$chain" ] && vbin=${spec#*@}
        line=()
        for run in $(seq "$runs"); do
            read -r ir_s al_s < <(count "$vbin" "$chain" "$method" "$small")
            read -r ir_l al_l < <(count "$vbin" "$chain" "$method" "$large")
            n=$((large - small))
            line+=("$(awk -v a="$ir_l" -v b="$ir_s" -v n="$n" 'BEGIN{printf "%.1f", (a-b)/n}')")
            line+=("$(awk -v a="$al_l" -v b="$al_s" -v n="$n" 'BEGIN{printf "%.2f", (a-b)/n}')")
        done
        printf '%-8s %-40s %12s %12s %10s %10s\n' "$method" "$label" "${line[0]}" "${line[2]:-}" "${line[1]}" "${line[3]:-}"
        result["$method $label"]="${line[0]} ${line[1]}"
    done
done

# reqwest-retry + contract: reqwest-retry's call plus what the contract
# itself adds to the empty stack (contract-lean − empty): the line a retry
# layer keeping the contract can be held to beside reqwest-retry.
for method in $methods; do
    rr=${result["$method reqwest-retry"]:-}
    cl=${result["$method contract-lean"]:-}
    em=${result["$method empty"]:-}
    if [ -n "$rr" ] && [ -n "$cl" ] && [ -n "$em" ]; then
        result["$method reqwest-retry+contract"]=$(awk -v r="$rr" -v c="$cl" -v e="$em" \
            'BEGIN{split(r,a," "); split(c,b," "); split(e,d," ");
                   printf "%.1f %.2f", a[1]+b[1]-d[1], a[2]+b[2]-d[2]}')
        printf '%-8s %-40s %12s %12s %10s\n' "$method" "reqwest-retry+contract" \
            "${result["$method reqwest-retry+contract"]% *}" "" "${result["$method reqwest-retry+contract"]#* }"
    fi
done

echo
echo "# ratios, run 1: instructions (difference), allocations (difference)"
for method in $methods; do
    for variant in $variants; do
        label=${variant%%=*}
        case $label in bare|empty|reqwest-retry) continue ;; esac
        read -r ir al <<<"${result["$method $label"]}"
        row=$(printf '%-5s %-30s' "$method" "$label")
        for ref in reqwest-retry contract contract-lean reqwest-retry+contract; do
            [ "$ref" = "$label" ] && continue
            other=${result["$method $ref"]:-}
            [ -n "$other" ] || continue
            read -r rir ral <<<"$other"
            row+=$(awk -v r="$ref" -v a="$ir" -v b="$rir" -v x="$al" -v y="$ral" \
                'BEGIN{printf " | / %s %.3f× (%+.0f), %+.2f", r, a/b, a-b, x-y}')
        done
        echo "$row"
    done
done
