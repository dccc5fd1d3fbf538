#!/usr/bin/env sh
# Quick start 1: set up and run the main job.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
exec .venv/bin/hkv demo "$@"
