#!/usr/bin/env bash
# Fetch Triton's perf_analyzer into .tools/perf_analyzer (no root needed) and write the
# wrapper .tools/bin/perf_analyzer, which runs it with its libraries on LD_LIBRARY_PATH.
#
# PyPI's `perf-analyzer` is a placeholder; the binary ships inside tritonclient's manylinux
# wheel (tritonclient-X.data/data/bin/perf_analyzer). 2.51.0 is the newest whose binary
# runs on glibc 2.36 (Debian 12): 2.52.0 on need glibc 2.38, 2.61.0 on ship no binary.
# It links libb64.so.0d (Debian's libb64-0d: apt-get download, dpkg -x) and
# libcudart.so.12 (PyPI's nvidia-cuda-runtime-cu12; loaded, not used without a GPU).
# Every download is pinned by version and sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.tools/perf_analyzer
wrapper=.tools/bin/perf_analyzer
[ -x "$wrapper" ] && [ -x "$dest/perf_analyzer" ] && exit 0

TRITONCLIENT=2.51.0
TRITONCLIENT_SHA=c485bb0123bdf310f90bc8b03d3489b28df2ffed55b30c7eee0b795b48113d52
CUDART=12.9.79
CUDART_SHA=25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3
LIBB64=1.2-5+b1
LIBB64_SHA=b0e1d6fde8bdccc18c3884144aede064dc82464dd4777275fa80e74c05583e82

python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() {  # FILE SHA256
  echo "$2  $1" | sha256sum -c --quiet - || { echo "checksum mismatch: $1" >&2; exit 1; }
}
wheel() {  # PACKAGE VERSION: one manylinux wheel of it into $work
  "$python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --python-version 3.11 -d "$work" "$1==$2" >/dev/null
}

wheel tritonclient "$TRITONCLIENT"
wheel nvidia-cuda-runtime-cu12 "$CUDART"
check "$work"/tritonclient-"$TRITONCLIENT"-*.whl "$TRITONCLIENT_SHA"
check "$work"/nvidia_cuda_runtime_cu12-"$CUDART"-*.whl "$CUDART_SHA"

mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
apt=(-qq -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1
     -o APT::Sandbox::User="$(id -un)")
apt-get "${apt[@]}" update >/dev/null
(cd "$work" && apt-get "${apt[@]}" download "libb64-0d=$LIBB64" >/dev/null)
check "$work"/libb64-0d_*_amd64.deb "$LIBB64_SHA"

"$python" - "$work" "$TRITONCLIENT" <<'EOF'
import sys, zipfile
from pathlib import Path
work, version = Path(sys.argv[1]), sys.argv[2]
(tc,) = work.glob(f"tritonclient-{version}-*.whl")
(cu,) = work.glob("nvidia_cuda_runtime_cu12-*.whl")
zipfile.ZipFile(tc).extract(f"tritonclient-{version}.data/data/bin/perf_analyzer", work / "x")
zipfile.ZipFile(cu).extract("nvidia/cuda_runtime/lib/libcudart.so.12", work / "x")
EOF
dpkg -x "$work"/libb64-0d_*_amd64.deb "$work/b64"

rm -rf "$dest"
mkdir -p "$dest/lib" .tools/bin
install -m 0755 "$work/x/tritonclient-$TRITONCLIENT.data/data/bin/perf_analyzer" "$dest/"
install -m 0644 "$work/x/nvidia/cuda_runtime/lib/libcudart.so.12" "$dest/lib/"
install -m 0644 "$work/b64/usr/lib/x86_64-linux-gnu/libb64.so.0d" "$dest/lib/"
cat >"$wrapper" <<'EOF'
#!/usr/bin/env bash
# Triton's perf_analyzer with the libraries scripts/fetch_perf_analyzer.sh fetched.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../perf_analyzer" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/perf_analyzer" "$@"
EOF
chmod 0755 "$wrapper"
"$wrapper" --version
