#!/usr/bin/env bash
# The whole GPU check of the speed work, prepared to run once on a GPU machine (not part of CI).
#
#   bash .ci/gpu_check.sh prepare   # here, with network: bake a project into .gpu/ and fetch the
#                                   # wheels the GPU machine lacks (hydra-core, omegaconf, antlr4)
#   bash .ci/gpu_check.sh run       # there, with .gpu/ carried: every bench run, into $OUT/gpu_check.log
#
# The runs: resnet18 at batch 256 on one process with nccl in bf16+channels_last, with and without
# torch.compile, with data.on_device, in fp32 and fp16; two processes sharing the GPU over gloo;
# a resnet50 checkpoint hold; a short training through scripts/run_single.sh. About 6 minutes on one H200.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"

prepare() {
  rm -rf .gpu && mkdir -p .gpu/whl
  grep -qx '/.gpu/' .git/info/exclude 2> /dev/null || echo '/.gpu/' >> .git/info/exclude
  "$PYTHON" -m cookiecutter --no-input -o .gpu . git_init=no > /dev/null || exit 1
  "$PYTHON" -m pip download -q --no-deps -d .gpu/whl 'hydra-core>=1.3,<1.4' 'omegaconf>=2.2,<2.4' || exit 1
  "$PYTHON" -m pip wheel -q --no-deps -w .gpu/whl 'antlr4-python3-runtime==4.9.3' || exit 1  # sdist only on PyPI
  ls .gpu .gpu/whl
}

bench() {
  echo "== torchrun $*"
  timeout 300 python3 -m torch.distributed.run --standalone "$@" 2>&1 | grep -E '^(bench|project|bare|lightning|ratio|checkpoint)|Error|error' | tail -12
}

run() {
  local out="${OUT:-/tmp/gpu_check}" resnet18=(--model resnet18 --batch 256 --workers 8 --steps 100 --rounds 5)
  mkdir -p "$out"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
  cd .gpu/*/ || exit 1
  exec > >(tee "$out/gpu_check.log") 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  bench --nproc-per-node=1 benchmarks/bench.py "${resnet18[@]}" --precision bf16 --channels-last
  bench --nproc-per-node=1 benchmarks/bench.py "${resnet18[@]}" --precision bf16 --channels-last --compile
  bench --nproc-per-node=1 benchmarks/bench.py "${resnet18[@]}" --precision bf16 --channels-last --on-device
  bench --nproc-per-node=1 benchmarks/bench.py "${resnet18[@]}" --precision fp32
  bench --nproc-per-node=1 benchmarks/bench.py "${resnet18[@]}" --precision fp16 --channels-last
  bench --nproc-per-node=2 benchmarks/bench.py --model resnet18 --batch 256 --workers 4 --steps 50 --rounds 3 \
    --precision bf16 --channels-last
  bench --nproc-per-node=1 benchmarks/bench.py --model resnet50 --batch 128 --workers 8 --steps 20 --rounds 1 \
    --precision bf16 --channels-last
  echo "== scripts/run_single.sh"
  timeout 240 bash scripts/run_single.sh model=resnet18 data.batch_size=256 data.train_size=51200 data.num_workers=8 \
    trainer.epochs=2 trainer.precision=bf16 trainer.channels_last=true 2>&1 | tail -6
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: bash .ci/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
