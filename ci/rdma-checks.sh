#!/usr/bin/env bash
# The rdma fabric on a real verbs stack: run inside ci/rxe-vm.sh (soft-RoCE, stock rdma-core)
# from the repository root, after `ci/rdma-checks.sh --build` on the host built what it runs:
#
#   ci/rdma-checks.sh --build && ci/rxe-vm.sh ci/rdma-checks.sh
#
# Fails (non-zero) on the first check that fails; every check prints what it ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/rxe

if [ "${1:-}" = "--build" ]; then
  # The binaries the VM runs: dmem with the rdma fabric, and the device test binaries.
  mkdir -p "$bin"
  cargo build -p dmem-cli --features rdma
  cp target/debug/dmem "$bin/dmem"
  exe() { sed -n 's/^ *Executable [^(]*(\(.*\))$/\1/p' | tail -n 1; }
  rxe=$(cargo test -p dmem-rdma --features device --test rxe --no-run 2>&1 | tee /dev/stderr | exe)
  fabrics=$(cargo test -p dmem-harness --features rdma --test fabrics --no-run 2>&1 | tee /dev/stderr | exe)
  [ -n "$rxe" ] && [ -n "$fabrics" ] || { echo "rdma-checks: test binaries not found" >&2; exit 1; }
  cp "$rxe" "$bin/rxe-test"
  cp "$fabrics" "$bin/fabrics-test"
  exit 0
fi

[ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ] || { echo "rdma-checks: no RDMA device (run inside ci/rxe-vm.sh)" >&2; exit 1; }
step() { echo; echo "== rdma: $*"; }

step "device tests (verbs semantics, post lists, concurrent FAA, bounds) on $(ls /sys/class/infiniband)"
timeout 300 "$bin/rxe-test" --ignored --test-threads 1 \
  --skip revoked_cn_loses_access

step "dmem perf --fabric rdma: READ, WRITE, CAS, FAA at batch 1 and 16"
for op in read write cas faa; do
  timeout 120 "$bin/dmem" perf --fabric rdma --cns 1 --threads 1 --clients 1 \
    --op "$op" --size 8 --batch 1,16 --duration-ms 3000 --json
done

step "the one-sided protocols' SmallBank through the NIC in one process (checker, invariants)"
timeout 900 "$bin/fabrics-test" --ignored --test-threads 1 --nocapture one_sided_protocols_run_smallbank_on_rdma

step "dmem bench --fabric rdma: MN and CN processes (checker, invariants)"
# One CN of 4 coordinators: two busy-polling CN processes on the VM's CPUs starve
# soft-RoCE's kernel work (see verbs/rdma/README.md).
timeout 900 "$bin/dmem" bench --fabric rdma --workload smallbank --scale tiny \
  --protocol pandora,oocc --cns 1 --threads 1 --coroutines 4 --duration-ms 1500

step "dmem cluster on rdma: LOTUS's lock RPCs between two CN processes (checker, invariants)"
# Verbs through the NIC; the lock RPCs travel the CNs' control-plane TCP connections
# (`RdmaCn::with_tcp_messages`), not verbs SENDs.
timeout 900 "$bin/dmem" cluster --cluster examples/clusters/smallbank-lotus-rdma-3mn-2cn.toml

step "dmem cluster on rdma with a CN killed by SIGKILL and recovered (Pandora)"
timeout 300 "$bin/dmem" cluster --cluster examples/clusters/smallbank-rdma-1mn-2cn.toml \
  --kill cn1 --kill-after-ms 1000

echo
echo "rdma-checks: all passed"
