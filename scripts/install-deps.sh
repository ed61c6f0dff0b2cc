#!/usr/bin/env bash
# Installs every Debian package dtrain needs to build, test and benchmark.
# Idempotent: when everything is already present it only checks and returns.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev ocl-icd-opencl-dev          # oneDNN 2.6; its CMake config needs OpenCL's
  libgloo-dev libhiredis-dev              # collectives between processes; Gloo's Redis store
  redis-server                            # the multi-worker test that meets through Redis
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  libxxhash-dev                           # checkpoint checksums (XXH3, several GB/s per core)
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev libomp-dev     # the fuzz preset: libFuzzer and the sanitizers, OpenMP for clang
  dataset-fashion-mnist
  pybind11-dev python3-dev python3-numpy python3-pytest   # the Python package (python/) and its tests
  python3-h5py                            # the weights inside Keras's .keras archives
  python3-cloudpickle                     # a parameter-server chief ships the program's functions to its workers
  libsentencepiece-dev                    # subword tokenizers trained and applied by the text pipeline
  chromium-headless-shell                 # the doctor's HTML report, opened in a real browser by a test
  slurmctld slurmd slurm-client munge     # a single-node Slurm for the cluster tests (scripts/slurm_local.sh)
  iproute2                                # ip netns for the emulated hosts, ss for the free ports of the Slurm test
)

# `--peers` adds what the side-by-side benchmarks need: PyTorch (run with /usr/bin/python3)
# and OpenBLAS, without which Debian's torch falls back to the slow reference BLAS.
# iperf3 measures the loopback link beside the all-reduce benchmarks.
# `--corpora` adds the text the language-model example trains on: the GNU Collaborative
# International Dictionary of English and the fortune cookies (examples/char_lm.py).
for flag in "$@"; do
  case "$flag" in
    --peers) packages+=(python3-torch python3-numpy libopenblas0-pthread iperf3) ;;
    --corpora) packages+=(dict-gcide fortunes-min) ;;
    *) echo "install-deps: unknown option $flag (--peers, --corpora)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
