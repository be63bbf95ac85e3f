#!/usr/bin/env bash
# The seed experiment on one GPU, end to end, on a CUDA machine that has torch but no network (nothing
# is installed): the seed preset at P=4 over m, its 4 stages as CUDA streams of one process (mode
# single_gpu), and the P=1 small-GEMM curve. Budget: 8 minutes.
#
#   scripts/gpu_check.sh [OUT]        OUT defaults to bench/gpu_check/<UTC time>
#
# It writes three files worth bringing back: OUT/results.md (the GPU, driver, torch, CUDA and NCCL
# versions; the seed table from this machine's own timings: p, m, t_slot, step, bubble theory, bubble
# measured, and each run's CUDA allocator peak; the P=1 curve of t_slot at every microbatch size),
# OUT/traces.tar.gz (every run directory: run.json and its small traces, STEPS profiled steps each) and
# OUT/runs.log. The analysis, and with it the waterfall per m, runs later on a CPU machine:
#   tar xzf traces.tar.gz && python -m analysis analyze traces/<run>
# (here too when polars and msgspec are importable).
#
# Environment overrides: PY (a python with torch; default .venv/bin/python, else python3), GPU (the one
# GPU to use, default 0), SCHED (gpipe), MS ("1 2 4 8 16 32"), P (4), PRESET (seed), STEPS (2 profiled
# steps), TIMED_STEPS (3), RUN_TIMEOUT (90 s per run), BUDGET (420 s for all runs). DEVICE=cpu (with
# PRESET=tiny) exercises this script without a GPU, P ranks as processes; that is how the tests check it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${1:-bench/gpu_check/$(date -u +%Y%m%d-%H%M%S)}
SCHED=${SCHED:-gpipe}
MS=${MS:-"1 2 4 8 16 32"}
P=${P:-4}
PRESET=${PRESET:-seed}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-2}
TIMED_STEPS=${TIMED_STEPS:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
BUDGET=${BUDGET:-420}

if [ "$DEVICE" = cuda ]; then
  export CUDA_VISIBLE_DEVICES=${GPU:-0}  # one GPU: P > 1 runs as streams of one process
fi
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$DEVICE" = cuda ] && [ "$GPUS" -lt 1 ]; then
  echo "error: no CUDA device visible to $PY (DEVICE=cpu PRESET=tiny runs this script on CPU)" >&2
  exit 2
fi

mkdir -p "$OUT/traces"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)"
  echo "request: SCHED=$SCHED P=$P MS=\"$MS\" PRESET=$PRESET DEVICE=$DEVICE STEPS=$STEPS TIMED_STEPS=$TIMED_STEPS"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: not available"
  "$PY" -c '
import torch
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
print(f"torch {torch.__version__}  cuda {torch.version.cuda}  nccl {nccl}  gpus {torch.cuda.device_count()}")
for i in range(torch.cuda.device_count()):
    print(f"gpu {i}: {torch.cuda.get_device_name(i)}")
'
} | tee "$OUT/environment.txt"

started=$SECONDS
# run LABEL ARGS...: one traced run within what is left of the budget
run() {
  local label=$1 left limit began
  shift
  left=$(( BUDGET - (SECONDS - started) ))
  if [ "$left" -lt 20 ]; then
    echo "$label: skipped, the ${BUDGET} s budget is spent" | tee -a "$OUT/runs.log"
    return
  fi
  limit=$(( left < RUN_TIMEOUT ? left : RUN_TIMEOUT ))
  began=$SECONDS
  if timeout "$limit" "$PY" -m runners trace --sched "$SCHED" --preset "$PRESET" --device "$DEVICE" \
      --steps "$STEPS" --timed-steps "$TIMED_STEPS" --no-profile-memory --traces "$OUT/traces" "$@" \
      >>"$OUT/runs.log" 2>&1; then
    echo "$label: done in $(( SECONDS - began )) s" | tee -a "$OUT/runs.log"
  else
    echo "$label: FAILED or timed out after $(( SECONDS - began )) s (see $OUT/runs.log)" | tee -a "$OUT/runs.log"
  fi
}
for m in $MS; do
  run "p=$P m=$m" --p "$P" --m "$m"
done
run "p=1 m=1 (the small-GEMM curve)" --p 1 --m 1

if "$PY" -c "import polars, msgspec" 2>/dev/null; then
  for dir in "$OUT"/traces/*/; do
    [ -L "${dir%/}" ] && continue  # traces/latest
    "$PY" -m analysis analyze "$dir" >>"$OUT/runs.log" 2>&1 || echo "analysis of $dir failed" | tee -a "$OUT/runs.log"
  done
fi
{
  echo "# GPU check"
  echo
  sed 's/^/    /' "$OUT/environment.txt"
  echo
  "$PY" -m runners.seed_table "$OUT"/traces/*/ || echo "no complete run"
} >"$OUT/results.md"
tar czf "$OUT/traces.tar.gz" -C "$OUT" --exclude=latest traces
cat "$OUT/results.md"
echo "results: $OUT/results.md  traces: $OUT/traces.tar.gz  (total $(( SECONDS - started )) s)"
