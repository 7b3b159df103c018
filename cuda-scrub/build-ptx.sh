#!/usr/bin/env bash
# Regenerates the committed PTX and its stamp from src/main/cuda (run by hand after editing a
# kernel, never during CI; the Maven build only checks that the stamp matches the sources).
# Usage: cuda-scrub/build-ptx.sh   (needs nvcc 12.8+ on PATH or NVCC=/path/to/nvcc)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
NVCC="${NVCC:-nvcc}"
command -v "$NVCC" >/dev/null || { echo "build-ptx: nvcc not found (set NVCC=/path/to/nvcc)" >&2; exit 1; }
src=src/main/cuda
out=src/main/resources/dev/kvshield/cuda
mkdir -p "$out"
# compute_80: one PTX that the driver JIT-compiles for sm_80 and every newer GPU (Hopper included).
"$NVCC" -ptx -arch=compute_80 -O3 -o "$out/kernels.ptx.tmp" "$src/kvshield_kernels.cu"
version="$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n1)"
read -r major minor <<<"$version"
{
  echo "# Written by cuda-scrub/build-ptx.sh. The Maven build fails if a source hash differs: rerun the script."
  for f in "$src"/*.cu "$src"/*.h; do
    echo "source.$(basename "$f").sha256=$(sha256sum "$f" | cut -d' ' -f1)"
  done
  echo "nvcc.release=$major.$minor"
  echo "ptx.arch=compute_80"
  # A driver JIT-compiles PTX from an nvcc of its own CUDA version or older: CUDA X.Y -> X*1000+Y*10.
  echo "min.driver.version=$((major * 1000 + minor * 10))"
} >"$out/kernels.ptx.stamp.tmp"
mv "$out/kernels.ptx.tmp" "$out/kernels.ptx"
mv "$out/kernels.ptx.stamp.tmp" "$out/kernels.ptx.stamp"
echo "build-ptx: wrote $out/kernels.ptx ($(wc -c <"$out/kernels.ptx") bytes) and kernels.ptx.stamp"
