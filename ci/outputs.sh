#!/usr/bin/env bash
# The deterministic outputs a refactor must leave byte-identical, written to a folder so two
# builds can be compared:
#
#   ci/outputs.sh BASE_BUILD/dmem /tmp/before && ci/outputs.sh target/release/dmem /tmp/after
#   diff -r /tmp/before /tmp/after
#
# usage: ci/outputs.sh DMEM OUTDIR [NAME-REGEX]  (NAME-REGEX picks runs by name, e.g. 'lotus|main')
# Wall-clock fields are removed; each file ends with the command's exit code.
set -u
bin=$1; out=$2; filter=${3:-.}
mkdir -p "$out"
strip() { sed -E 's/"wall_[a-z_]*": ?[0-9.e+-]+,?//g; s/"elapsed[a-z_]*": ?[0-9.e+-]+,?//g; s/ in [0-9.]+ ?m?s//g'; }
run() {
  local name=$1; shift
  echo "$name" | grep -Eq -- "$filter" || return 0
  "$bin" "$@" 2>/dev/null | strip > "$out/$name.txt"
  echo "rc=${PIPESTATUS[0]}" >> "$out/$name.txt"
}
run main bench --workload smallbank --protocol ford,pandora,pandora-lock-logging
for w in smallbank tatp tpcc ycsb kvs; do
  run "bench-$w-ford-occ" bench --workload "$w" --scale tiny --protocol ford,pandora,occ,oocc,drtm,dslr --duration-ms 2 --json
  run "bench-$w-motor-lotus" bench --workload "$w" --scale tiny --protocol motor,motor-si,lotus,lotus-si --duration-ms 2 --json
  run "bench-$w-dnl" bench --workload "$w" --scale tiny --protocol dnl-4,dnl-2,dnl-1,fasst --duration-ms 2 --json
done
for p in ford pandora oocc drtm dslr motor lotus dnl-4 fasst; do
  run "litmus-$p" litmus --protocol "$p" --seeds 20 --json
done
for b in complicit-abort missing-insert-log covert-locks relaxed-locks lost-decision log-without-lock; do
  run "litmus-ford-$b" litmus --protocol "ford:$b" --seeds 20 --json
done
for p in pandora ford motor lotus oocc dnl-4; do
  run "recover-$p" recover --protocol "$p" --workload smallbank --json
done
# A fixed --out: the summary names it, and two builds must print the same.
run reproduce-pandora reproduce pandora --json --out /tmp/dmem-outputs-reproduce
