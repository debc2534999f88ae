# Shared by the launch scripts: KEY=VALUE parsing, checks, GPU count, run dir. Source it.
# Every check fails with one line that says what to do, before torchrun starts.

PYTHON="${PYTHON:-python}"
PROJECT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HYDRA_ARGS=()

die() {
  echo "error: $*" >&2
  exit 2
}

# parse_keys "KEY1 KEY2 ..." "$@": KEY=VALUE arguments (upper case) set the named variables;
# anything else is passed to train.py as a Hydra override (collected in HYDRA_ARGS).
parse_keys() {
  local allowed=" $1 " arg key
  shift
  for arg in "$@"; do
    if [[ "$arg" =~ ^([A-Z][A-Z0-9_]*)=(.*)$ ]]; then
      key="${BASH_REMATCH[1]}"
      [[ "$allowed" == *" $key "* ]] || die "unknown key $key; known keys:$allowed(Hydra overrides are lower case, e.g. trainer.epochs=3)"
      printf -v "$key" '%s' "${BASH_REMATCH[2]}"
    else
      HYDRA_ARGS+=("$arg")
    fi
  done
}

# require_int NAME VALUE MIN: VALUE must be a whole number >= MIN.
require_int() {
  [[ "$2" =~ ^[0-9]+$ ]] || die "$1=$2 is not a whole number; give e.g. $1=$3"
  (( 10#$2 >= $3 )) || die "$1=$2 must be at least $3"
}

# The GPUs this job may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists.
visible_gpu_count() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c '[^[:space:]]' || true
  elif command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi -L 2> /dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

# A new run dir under outputs/, never one that exists: mkdir is atomic, so two jobs started
# in the same second still get different dirs.
new_run_dir() {
  local base="outputs/$(date +%Y-%m-%d_%H-%M-%S)" dir suffix=0
  mkdir -p outputs
  dir="$base"
  until mkdir "$dir" 2> /dev/null; do
    suffix=$((suffix + 1))
    dir="${base}_$suffix"
  done
  echo "$dir"
}

# check_launch NPROC [RUN_DIR]: compose and validate the config as train.py will, with NPROC
# local ranks and, for an existing RUN_DIR, the checkpoint it would resume from; so a bad value
# fails here once, instead of in every worker and every restart. Nothing is written.
check_launch() {
  local scratch dir="${2:-}"
  scratch="$(mktemp -d)"
  [[ -n "$dir" && -d "$dir" ]] || dir="$scratch"
  DDP_CHECK_ONLY=1 LOCAL_WORLD_SIZE="$1" "$PYTHON" "$PROJECT_DIR/train.py" \
    hydra.run.dir="$dir" hydra.output_subdir=null "${HYDRA_ARGS[@]}" || { rm -rf "$scratch"; exit 2; }
  rm -rf "$scratch"
}
