#!/usr/bin/env bash
# Installs the release build into a scratch prefix, builds examples/consumer against the
# installed package with find_package(dtrain), and runs the result.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/${PRESET:-release}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S examples/consumer -B "$prefix/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" >/dev/null
"$prefix/consumer-build/custom_loop_mlp" --quick
test -x "$prefix/bin/dtrain"
echo "check-install: built and ran an example against the installed dtrain package"
