#!/usr/bin/env bash
# Fresh machine -> full test suite (real Ray cluster, real S3 servers, TensorFlow parse check, torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# the shell scripts first (shellcheck, installed by setup.sh all): deploy/ runs them on VMs
shopt -s globstar
.venv/bin/shellcheck --severity=style deploy/**/*.sh scripts/*.sh
exec .venv/bin/python -m pytest -rs "$@"
