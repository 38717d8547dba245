#!/usr/bin/env bash
# The `causal_conv1d` package (Dao-AILab's CUDA conv) onto a lent GPU machine, so that transformers' GDN layers
# run its kernels instead of their torch conv fallback: issue 40's strongest default path to compare with. It
# ships as a 30 KB sdist whose setup.py downloads a prebuilt wheel from GitHub (unreachable from the machine)
# or builds for eight GPU architectures; here it builds for the machine's own only (sm_90), ~1-2 min.
#
#   bash tools/causal_conv1d_gpu.sh prepare     # HERE: the sdist into .gpu-wheels/ (git-ignored; carry it)
#   bash tools/causal_conv1d_gpu.sh build       # DEVICE: build and install into $TARGET, then import it
#
# Parameters (environment): CAUSAL_CONV1D_VERSION (1.7.0), TARGET (/tmp/site: gpu_check.sh's PYTHONPATH entry),
# GENCODE (arch=compute_90,code=sm_90), MAX_JOBS (16).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${CAUSAL_CONV1D_VERSION:-1.7.0}
SDIST=.gpu-wheels/causal_conv1d-$VERSION.tar.gz
case ${1:-} in
  prepare)
    mkdir -p .gpu-wheels
    python3 - "$VERSION" "$SDIST" <<'EOF'
import json, sys, urllib.request
version, dest = sys.argv[1:]
files = json.load(urllib.request.urlopen("https://pypi.org/pypi/causal-conv1d/json"))["releases"][version]
sdist = next(f for f in files if f["packagetype"] == "sdist")
urllib.request.urlretrieve(sdist["url"], dest)
print(f"{dest}: {sdist['size']} bytes (sha256 {sdist['digests']['sha256']})")
EOF
    ;;
  build)
    [ -f "$SDIST" ] || { echo "no $SDIST: run 'prepare' here and carry .gpu-wheels/$(basename "$SDIST")"; exit 1; }
    work=$(mktemp -d)
    tar xzf "$SDIST" -C "$work"
    src="$work/causal_conv1d-$VERSION"
    # one architecture: the package's list of eight (sm_75 .. sm_121) would take most of a device run
    python3 - "$src/setup.py" "${GENCODE:-arch=compute_90,code=sm_90}" <<'EOF'
import sys
path, gencode = sys.argv[1:]
text = open(path).read()
anchor = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
assert anchor in text, "causal_conv1d's setup.py changed: look for where it lists its -gencode flags"
text = text.replace(anchor, f"    cc_flag = cc_flag if HIP_BUILD else ['-gencode', {gencode!r}]\n" + anchor, 1)
open(path, "w").write(text)
EOF
    CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-16} python3 -m pip install -q --no-build-isolation --no-deps \
      --no-index --target "${TARGET:-/tmp/site}" "$src"
    PYTHONPATH=${TARGET:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH} python3 -c \
      "import causal_conv1d, causal_conv1d_cuda; print('causal_conv1d', causal_conv1d.__version__, 'built and importable')"
    ;;
  *) sed -n 2,11p "$0"; exit 2 ;;
esac
