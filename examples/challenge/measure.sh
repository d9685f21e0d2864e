#!/bin/sh
# Measures the reference clients, not in the timed suite: each run bounded to 30 s, over
# seeds 1..N, JOBS runs at a time (each run starts servers of its own); prints one line per
# (challenge, mode) with how many runs ended pass (0), fail (1), undecided (3), other, and
# over 30 s, and the seeds of the runs that did not end as most did.
#
#   examples/challenge/measure.sh N challenge:mode [challenge:mode ...]
#   LOCKSLAB=./target/release/lockslab JOBS=4 examples/challenge/measure.sh 200 \
#       counter:fenced crash:once pause:claimed delay:claimed failover:sequence \
#       exactly-once:once
#
# CLIENT is the program run with the mode as its last argument (default: reference.py under
# /usr/bin/python3); for the Rust references, after `cargo build --release --example
# challenge`: CLIENT=./target/release/examples/challenge. KEEP=DIR keeps every run's output
# in DIR/challenge-mode/SEED.
set -u
N=$1; shift
LOCKSLAB=${LOCKSLAB:-lockslab}
JOBS=${JOBS:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
CLIENT=${CLIENT:-"/usr/bin/python3 $HERE/reference.py"}
export LOCKSLAB CLIENT
for pair in "$@"; do
    challenge=${pair%%:*}; mode=${pair#*:}
    # One line per seed: "seed exit-status".
    if [ -n "${KEEP:-}" ]; then
        logs="$KEEP/$challenge-$mode"; mkdir -p "$logs"
    else
        logs=$(mktemp -d)
    fi
    results=$(seq 1 "$N" | xargs -P "$JOBS" -I SEED sh -c '
        timeout -s INT 30 "$LOCKSLAB" challenge "$1" --seed SEED -- $CLIENT "$2" \
            >"$3/SEED" 2>&1
        echo "SEED $?"' sh "$challenge" "$mode" "$logs")
    count() { echo "$results" | awk -v want="$1" '$2 ~ want' | wc -l; }
    pass=$(count '^0$'); fail=$(count '^1$'); undecided=$(count '^3$')
    slow=$(count '^(124|130)$')
    other=$((N - pass - fail - undecided - slow))
    echo "$challenge $mode seeds=$N pass=$pass fail=$fail undecided=$undecided" \
        "other=$other over30s=$slow"
    # The odd ones out, to replay: the seeds whose status is not the commonest.
    common=$(echo "$results" | awk '{print $2}' | sort | uniq -c | sort -rn | awk 'NR==1{print $2}')
    odd=$(echo "$results" | awk -v c="$common" '$2 != c {print $1 "→" $2}' | sort -n | tr '\n' ' ')
    if [ -n "$odd" ]; then
        echo "  seeds (exit status) not $common: $odd"
        # Why each odd run ended as it did: its first finding ("- ") or undecided reason
        # ("? ", past the count of faults that missed), else its last line (an error of
        # lockslab's own is exit status 4).
        for seed in $(echo "$results" | awk -v c="$common" '$2 != c {print $1}' | sort -n); do
            why=$(grep -E '^  [-?] ' "$logs/$seed" | grep -v -m1 'faults that played missed' ||
                grep -v '^\s*$' "$logs/$seed" | tail -1)
            echo "    $seed: $(echo "$why" | sed 's/^ *//' | cut -c1-150)"
        done
    fi
    [ -n "${KEEP:-}" ] || rm -rf "$logs"
done
