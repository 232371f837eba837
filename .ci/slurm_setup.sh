#!/usr/bin/env bash
# Installs what tests/workflow/test_slurm.py needs for a real single-node SLURM: Debian's slurmctld, slurmd,
# slurm-client and munge. Idempotent (does nothing when the binaries are there), quiet, bounded by
# timeouts. It never fails the CI run: where it cannot install (not root, no apt-get, no network) it
# says so and tests/workflow/test_slurm.py skips with that reason. The daemons are NOT started here (no systemd):
# the test writes its own slurm.conf and munge key in a temp dir, starts munged/slurmctld/slurmd itself
# and stops them by pid.
set -uo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge)
BINARIES=(slurmctld slurmd sbatch squeue scontrol sinfo munged mungekey)

have_all() {
    local b
    for b in "${BINARIES[@]}"; do
        command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || return 1
    done
}

if have_all; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "slurm_setup: not root, cannot install ${PACKAGES[*]}: tests/workflow/test_slurm.py will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "slurm_setup: no apt-get, cannot install ${PACKAGES[*]}: tests/workflow/test_slurm.py will be skipped" >&2
    exit 0
fi

# Package scripts must not try to start services (there is no init system): keep an existing
# policy-rc.d, or put a temporary one in place that forbids starting any service.
policy=/usr/sbin/policy-rc.d
temp_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && temp_policy=1
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
status=0
timeout 300 apt-get update -qq >"$log" 2>&1 || status=$?
if [ "$status" = 0 ]; then
    timeout 900 apt-get install -y -qq --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        "${PACKAGES[@]}" >>"$log" 2>&1 || status=$?
fi
if [ "$temp_policy" = 1 ]; then
    rm -f "$policy"
fi

if [ "$status" != 0 ] || ! have_all; then
    echo "slurm_setup: installing ${PACKAGES[*]} failed (exit $status): tests/workflow/test_slurm.py will be skipped" >&2
    tail -n 20 "$log" >&2
else
    echo "slurm_setup: installed ${PACKAGES[*]}" >&2
fi
rm -f "$log"
exit 0
