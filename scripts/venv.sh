#!/usr/bin/env bash
# Makes or repairs the project-local virtual environment .venv/ from scripts/requirements.txt
# (PyPI): the torch 2.15 wheel whose LibTorch the build links, and the Python side of benches and
# goldens. Never touches the system Python. Idempotent: pip only checks pinned versions that are
# already there (~3 s); a torch of another version in .venv is replaced, and said so.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MLTRAIN_VENV_PYTHON:-python3}
torch_version() {  # from version.py: no import, no working torch needed
  sed -n "s/^__version__ = '\(.*\)'/\1/p" .venv/lib/python3*/site-packages/torch/version.py 2>/dev/null | head -1 || true
}
if [ ! -x .venv/bin/python ]; then
  if ! "$py" -m venv .venv >/dev/null 2>&1; then
    rm -rf .venv
    echo "mltrain: error: '$py -m venv .venv' failed: need Python 3.10+ with venv (fix: apt-get install python3-venv, or MLTRAIN_VENV_PYTHON=/path/to/python3)" >&2
    exit 2
  fi
fi
before=$(torch_version)
if ! .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements.txt; then
  echo "mltrain: error: pip could not install scripts/requirements.txt into .venv (see above; fix: check that PyPI is reachable, then rerun bash scripts/venv.sh)" >&2
  exit 2
fi
after=$(torch_version)
if [ -n "$before" ] && [ "$before" != "$after" ]; then
  echo "venv: replaced torch $before with $after in .venv"
fi
echo "venv: .venv has torch $after ($(.venv/bin/python --version))"
