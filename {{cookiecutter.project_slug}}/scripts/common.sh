# Shared by the launch scripts: KEY=VALUE parsing, checks, GPU count, run dir. Source it.
# Every check fails with one line that says what to do, before torchrun starts.

PYTHON="${PYTHON:-python}"
PROJECT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HYDRA_ARGS=()

# The workers' environment, set before any process imports torch (a value the user set wins).
# One thread per process is right when the processes share the cores (torchrun would set it
# with a warning per job). MKL_CBWR: Intel MKL may give a matrix product other low bits when its
# operands lie at other memory alignments, and a restarted process lays them out anew; STRICT
# makes CPU results depend on the inputs only, which bit-exact resume on CPUs needs.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export MKL_CBWR="${MKL_CBWR:-AUTO,STRICT}"

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

# require_free_port PORT: fail if PORT is already taken on this machine (node 0 must own it).
require_free_port() {
  "$PYTHON" - "$1" << 'PY' || die "MASTER_PORT=$1 is already in use on this machine: pick another, e.g. MASTER_PORT=$(( $1 + 1 ))"
import socket, sys
with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("", int(sys.argv[1])))
PY
}

# wait_for_master HOST PORT SECONDS: a bounded wait until node 0 listens, then a hint.
wait_for_master() {
  local deadline=$((SECONDS + $3))
  until "$PYTHON" -c "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2).close()" \
    "$1" "$2" 2> /dev/null; do
    (( SECONDS < deadline )) || die "node 0 is not reachable at $1:$2 after $3 s: start node 0 first, check MASTER_ADDR and MASTER_PORT, and test with: nc -zv $1 $2"
    sleep 1
  done
}

# The keys of a multi-node launch, their defaults, then scripts/cluster.env's (edited once per cluster).
MULTI_NODE_KEYS="NODE_RANK NNODES NPROC_PER_NODE GPUS MASTER_ADDR MASTER_PORT RUN_NAME MAX_RESTARTS LOCAL_ADDR WAIT_FOR_MASTER_S"
multi_node_defaults() {
  NODE_RANK="" NNODES=2 NPROC_PER_NODE="" GPUS="" MASTER_ADDR="" MASTER_PORT=29500 RUN_NAME="" MAX_RESTARTS=3
  LOCAL_ADDR="" WAIT_FOR_MASTER_S=120 RDZV_LAST_CALL_S=5
  if [[ -f "$PROJECT_DIR/scripts/cluster.env" ]]; then
    source "$PROJECT_DIR/scripts/cluster.env"
  fi
}

# check_multi_node_keys: check the multi-node keys, set MIN_NODES, MAX_NODES and RUN_NAME.
check_multi_node_keys() {
  [[ -n "$NODE_RANK" ]] || die "NODE_RANK is required: NODE_RANK=0 on the first node, 1, 2, ... on the others"
  require_int NODE_RANK "$NODE_RANK" 0
  require_int NPROC_PER_NODE "$NPROC_PER_NODE" 1
  require_int MAX_RESTARTS "$MAX_RESTARTS" 0
  require_int WAIT_FOR_MASTER_S "$WAIT_FOR_MASTER_S" 0
  require_int MASTER_PORT "$MASTER_PORT" 1
  (( 10#$MASTER_PORT <= 65535 )) || die "MASTER_PORT=$MASTER_PORT is outside 1..65535"
  if [[ "$NNODES" =~ ^([0-9]+):([0-9]+)$ ]]; then
    MIN_NODES="${BASH_REMATCH[1]}" MAX_NODES="${BASH_REMATCH[2]}"
    (( MIN_NODES >= 1 )) || die "NNODES=$NNODES: MIN must be at least 1"
    (( MIN_NODES <= MAX_NODES )) || die "NNODES=$NNODES: MIN is larger than MAX; give NNODES=MIN:MAX with MIN <= MAX"
  else
    require_int NNODES "$NNODES" 1
    MIN_NODES="$NNODES" MAX_NODES="$NNODES"
  fi
  (( NODE_RANK < MAX_NODES )) || die "NODE_RANK=$NODE_RANK is outside 0..$((MAX_NODES - 1)) for NNODES=$NNODES"
  if [[ -z "$MASTER_ADDR" ]]; then
    (( NODE_RANK == 0 )) || die "MASTER_ADDR is required on node $NODE_RANK: give node 0's address, e.g. MASTER_ADDR=node001"
    MASTER_ADDR="$(hostname)"
  fi
  # One run dir name on every node without typing it: the rendezvous point names the run.
  [[ -n "$RUN_NAME" ]] || RUN_NAME="multi_${MASTER_ADDR}_${MASTER_PORT}"
  RUN_NAME="${RUN_NAME//[^A-Za-z0-9._-]/_}"
}

# multi_node_args: make sure the rendezvous point is usable, then fill TORCHRUN_ARGS.
multi_node_args() {
  if (( NODE_RANK == 0 )); then
    require_free_port "$MASTER_PORT"
  else
    wait_for_master "$MASTER_ADDR" "$MASTER_PORT" "$WAIT_FOR_MASTER_S"
  fi
  TORCHRUN_ARGS=(--nproc-per-node="$NPROC_PER_NODE" --max-restarts="$MAX_RESTARTS")
  if [[ -n "$LOCAL_ADDR" ]]; then
    TORCHRUN_ARGS+=(--local-addr="$LOCAL_ADDR")
    # gloo and NCCL take their interface from the hostname, which may resolve to loopback:
    # point them at the interface that holds LOCAL_ADDR, unless the user already chose one.
    local iface
    iface="$(ip -o -4 addr show 2> /dev/null | awk -v addr="$LOCAL_ADDR" 'index($4, addr "/") == 1 { print $2; exit }')"
    if [[ -n "$iface" ]]; then
      export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$iface}" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$iface}"
    fi
  fi
  if [[ "$NNODES" != *:* ]]; then
    TORCHRUN_ARGS+=(--nnodes="$NNODES" --node-rank="$NODE_RANK" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT")
  else
    # Elastic: node 0 hosts the c10d rendezvous; nodes may join (the job restarts with the
    # larger world and resumes) and leave (it goes on with the smaller one, down to MIN).
    TORCHRUN_ARGS+=(--nnodes="$NNODES" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"
      --rdzv-id="$RUN_NAME" --rdzv-conf="is_host=$(( NODE_RANK == 0 )),last_call_timeout=$RDZV_LAST_CALL_S")
    # Workers then get a fresh store every round: torchrun's shared store keeps the last
    # round's keys, and a membership change does not count as a restart to tell them apart.
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
  fi
}

# apply_gpus: GPUS=0,1,2,3 chooses this node's GPUs: CUDA_VISIBLE_DEVICES for the job and, unless
# NPROC_PER_NODE is given, one process per listed GPU. Sets GPU_COUNT for check_launch.
GPU_COUNT=""
apply_gpus() {
  [[ -n "$GPUS" ]] || return 0
  [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "GPUS=$GPUS: give GPU indices separated by commas, e.g. GPUS=0,1,2,3"
  GPU_COUNT="$(tr ',' '\n' <<< "$GPUS" | wc -l)"
  (( GPU_COUNT == $(tr ',' '\n' <<< "$GPUS" | sort -u | wc -l) )) || die "GPUS=$GPUS lists a GPU twice: list each GPU once"
  export CUDA_VISIBLE_DEVICES="$GPUS"
  [[ -n "$NPROC_PER_NODE" ]] || NPROC_PER_NODE="$GPU_COUNT"
}

# default_nproc: one process per visible GPU, or 2 on a machine without one.
default_nproc() {
  local gpus
  gpus="$(visible_gpu_count)"
  (( gpus > 0 )) && echo "$gpus" || echo 2
}

# run_torchrun ARGS...: torchrun in the background, SIGTERM and SIGINT passed on to it. A
# scheduler's SIGTERM then reaches the workers (which checkpoint and stop) while this script
# waits, instead of ending the script and orphaning the job. Returns torchrun's status, or 143
# after a SIGTERM: "stopped with a checkpoint, launch again to continue" (a batch job can requeue).
run_torchrun() {
  local pid status=0 terminated=0
  "$PYTHON" -m torch.distributed.run "$@" &
  pid=$!
  trap 'terminated=1; kill -TERM "$pid" 2> /dev/null' TERM
  trap 'kill -INT "$pid" 2> /dev/null' INT
  while kill -0 "$pid" 2> /dev/null; do
    wait "$pid" && status=0 || status=$?
  done
  trap - TERM INT
  (( terminated )) && return 143
  return "$status"
}

# check_launch NPROC [RUN_DIR]: compose and validate the config as train.py will, with NPROC
# local ranks and, for an existing RUN_DIR, the checkpoint it would resume from; so a bad value
# fails here once, instead of in every worker and every restart. Nothing is written.
check_launch() {
  local scratch dir="${2:-}"
  scratch="$(mktemp -d)"
  [[ -n "$dir" && -d "$dir" ]] || dir="$scratch"
  DDP_CHECK_ONLY=1 DDP_CHECK_VISIBLE_GPUS="$GPU_COUNT" LOCAL_WORLD_SIZE="$1" "$PYTHON" "$PROJECT_DIR/train.py" \
    hydra.run.dir="$dir" hydra.output_subdir=null "${HYDRA_ARGS[@]}" || { rm -rf "$scratch"; exit 2; }
  rm -rf "$scratch"
}
