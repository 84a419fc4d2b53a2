#!/usr/bin/env bash
# The test extra adds up: a fresh venv gets only what `pip install ".[test]"` installs besides GE2 itself (the
# project's dependencies and its test extra, read from pyproject.toml), GE2 comes from the sources on PYTHONPATH
# (no second build: these tests need no native module), and tests/test_extras.py checks that every module the tests
# import, and every optional package they exercise, is there; tests/test_nonfinite.py then trains in it.
#   scripts/check_extras.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
"$PYTHON" -m venv "$workdir/venv"
requirements=$("$workdir/venv/bin/python" -c 'import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["test"]))')
echo "a fresh venv with the dependencies and the test extra only:" $requirements
"$workdir/venv/bin/python" -m pip install --quiet --progress-bar off $requirements
PYTHONPATH=python "$workdir/venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_extras.py \
  tests/test_nonfinite.py "$@"
