#!/bin/sh
# Measures the reference clients (examples/challenge/reference.py), not in the timed suite:
# each run bounded to 30 s, over seeds 1..N; prints one line per (challenge, mode) with how
# many runs ended pass (0), fail (1), undecided (3), other, and over 30 s.
#
#   examples/challenge/measure.sh N challenge:mode [challenge:mode ...]
#   LOCKSLAB=./target/debug/lockslab examples/challenge/measure.sh 20 pause:setnx pause:fenced
set -u
N=$1; shift
LOCKSLAB=${LOCKSLAB:-lockslab}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
for pair in "$@"; do
    challenge=${pair%%:*}; mode=${pair#*:}
    pass=0; fail=0; undecided=0; other=0; slow=0
    seed=1
    while [ "$seed" -le "$N" ]; do
        timeout -s INT 30 "$LOCKSLAB" challenge "$challenge" --seed "$seed" \
            -- "$PYTHON" "$HERE/reference.py" "$mode" >/dev/null 2>&1
        case $? in
            0) pass=$((pass + 1)) ;;
            1) fail=$((fail + 1)) ;;
            3) undecided=$((undecided + 1)) ;;
            124|130) slow=$((slow + 1)) ;;
            *) other=$((other + 1)) ;;
        esac
        seed=$((seed + 1))
    done
    echo "$challenge $mode seeds=$N pass=$pass fail=$fail undecided=$undecided other=$other over30s=$slow"
done
