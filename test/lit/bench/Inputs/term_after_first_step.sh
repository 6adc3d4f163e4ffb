#!/usr/bin/env bash
# term_after_first_step.sh OUT CMD...: runs CMD in a process group of its own and, once
# OUT/steps.tsv holds a step, sends SIGTERM to that whole group, as a tool's time limit does;
# then prints CMD's exit status. Any other status than 143 comes with what CMD printed last,
# so that a failure says why.
out=$1
shift
set -m  # job control: the background job gets its own process group, whose id is its pid
"$@" > "$out.printed" 2>&1 &
pid=$!
for _ in $(seq 1200); do
  grep -q . "$out/steps.tsv" 2> /dev/null && break
  sleep 0.1
done
kill -TERM -- "-$pid"
wait "$pid"
status=$?
# Status 2 comes of bash 5.2's trap parse (check.sh's note at its traps) only with its message.
if [ "$status" = 2 ] && grep -q "trap: line .*: unexpected EOF while looking for matching" "$out/check.log" 2> /dev/null; then
  echo "status 2 (bash's trap parse error)"
else
  echo "status $status"
fi
if [ "$status" != 143 ]; then
  echo "--- printed before its log:"; tail -n 20 "$out.printed"
  echo "--- check.log:"; tail -n 40 "$out/check.log"
  echo "--- steps.tsv:"; cat "$out/steps.tsv"
fi
exit 0
