#!/usr/bin/env sh
# Unpack vLLM VERSION's source distribution (its tests/) into .vllm-src.
# `pip download --no-binary :all:` cannot build vLLM here (no CUDA), but
# with --no-clean it leaves the unpacked source behind; that is all we need.
set -eu
cd "$(dirname "$0")/.."
VERSION=${1:?usage: vllm_sources.sh VERSION}
[ -d .vllm-src/tests/v1/core ] && [ "$(cat .vllm-src/.version 2>/dev/null)" = "$VERSION" ] && exit 0
work=$(mktemp -d)
TMPDIR=$work python3 -m pip download --quiet "vllm==$VERSION" --no-binary :all: --no-deps \
  --no-clean --no-build-isolation -d "$work/dl" >/dev/null 2>&1 || true
src=$(find "$work" -maxdepth 3 -type d -name tests -path '*vllm_*' | head -1)
if [ -z "$src" ]; then
  echo "could not unpack vllm==$VERSION's source distribution (see pip download)" >&2
  rm -rf "$work"; exit 1
fi
rm -rf .vllm-src
mkdir .vllm-src
cp -r "$src" .vllm-src/tests
echo "$VERSION" > .vllm-src/.version
rm -rf "$work"
echo "vLLM $VERSION tests in .vllm-src/tests" >&2
