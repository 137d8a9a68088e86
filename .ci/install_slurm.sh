#!/usr/bin/env bash
# Installs the Debian packages the Slurm tests need (a local cluster: scripts/slurm/local_cluster.sh).
# Never fails the build: where installing is impossible (no root, no apt, no registry), the Slurm
# tests skip with a one-line reason.
set -u
readonly PACKAGES=(slurmctld slurmd slurm-client munge)

export PATH="$PATH:/usr/sbin:/sbin"
# type fails when any one of them is missing.
if type -P munged slurmctld slurmd sbatch >/dev/null; then
    echo "install_slurm: Slurm already installed"
    exit 0
fi
if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "install_slurm: skipped (needs root and apt-get); the Slurm tests will be skipped"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null; then
    echo "install_slurm: installed ${PACKAGES[*]}"
else
    echo "install_slurm: apt-get failed; the Slurm tests will be skipped"
fi
exit 0
