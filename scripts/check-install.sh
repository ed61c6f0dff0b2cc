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
# The Python package, installed for Debian's python3, trains and finds the command.
site=$(ls -d "$prefix"/lib/python3*/dist-packages)
PYTHONPATH="$site" /usr/bin/python3 -c "
import numpy as np, dtrain as tf
m = tf.keras.Sequential([tf.keras.layers.Dense(2, activation='softmax', input_shape=(3,))])
m.compile('adam', 'sparse_categorical_crossentropy')
m.fit(np.zeros((8, 3), np.float32), np.zeros(8, np.int64), verbose=0)
"
PYTHONPATH="$site" /usr/bin/python3 -m dtrain summary examples/configs/seed_small.json >/dev/null
echo "check-install: built and ran an example against the installed dtrain package, and trained from its Python package"
