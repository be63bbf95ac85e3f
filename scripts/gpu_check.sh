#!/usr/bin/env bash
# The toolkit's GPU path, end to end, on a CUDA machine that has torch but no network (nothing is
# installed): environment, traced runs of the seed preset over m, and a result table. Budget: 8 minutes.
#
#   scripts/gpu_check.sh [OUT]        OUT defaults to bench/gpu_check/<UTC time>
#
# Environment overrides: PY (a python with torch; default .venv/bin/python, else python3), SCHED (gpipe),
# MS ("1 2 4 8 16 32"), P (GPUs, at most 4), PRESET (seed), STEPS (2 profiled steps), RUN_TIMEOUT (90 s
# per run), BUDGET (420 s for all runs). DEVICE=cpu (with PRESET=tiny) exercises this script without a
# GPU; that is how the tests check it.
# One GPU means P=1: NCCL cannot give two ranks the same GPU, and the runner refuses P > GPUs. A P=1 run
# still measures the seed's small-GEMM effect (m * t_slot as microbatches shrink) and traces the CUDA path.
# The traces are analysed here when polars is importable, else later on a CPU machine:
#   python -m analysis analyze OUT/traces/<run>
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${1:-bench/gpu_check/$(date -u +%Y%m%d-%H%M%S)}
SCHED=${SCHED:-gpipe}
MS=${MS:-"1 2 4 8 16 32"}
PRESET=${PRESET:-seed}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
BUDGET=${BUDGET:-420}

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$DEVICE" = cuda ] && [ "$GPUS" -lt 1 ]; then
  echo "error: no CUDA device visible to $PY (DEVICE=cpu PRESET=tiny runs this script on CPU)" >&2
  exit 2
fi
if [ -z "${P:-}" ]; then
  if [ "$DEVICE" = cuda ]; then P=$(( GPUS < 4 ? GPUS : 4 )); else P=2; fi
fi

mkdir -p "$OUT/traces"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)"
  echo "request: SCHED=$SCHED P=$P MS=\"$MS\" PRESET=$PRESET DEVICE=$DEVICE STEPS=$STEPS"
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
for m in $MS; do
  left=$(( BUDGET - (SECONDS - started) ))
  if [ "$left" -lt 20 ]; then
    echo "m=$m: skipped, the ${BUDGET} s budget is spent" | tee -a "$OUT/runs.log"
    continue
  fi
  limit=$(( left < RUN_TIMEOUT ? left : RUN_TIMEOUT ))
  began=$SECONDS
  if timeout "$limit" "$PY" -m runners trace --sched "$SCHED" --p "$P" --m "$m" --preset "$PRESET" \
      --device "$DEVICE" --steps "$STEPS" --traces "$OUT/traces" >>"$OUT/runs.log" 2>&1; then
    echo "m=$m: done in $(( SECONDS - began )) s" | tee -a "$OUT/runs.log"
  else
    echo "m=$m: FAILED or timed out after $(( SECONDS - began )) s (see $OUT/runs.log)" | tee -a "$OUT/runs.log"
  fi
done

if "$PY" -c "import polars, msgspec" 2>/dev/null; then
  for run in "$OUT"/traces/*/; do
    [ -L "${run%/}" ] && continue  # traces/latest
    "$PY" -m analysis analyze "$run" >>"$OUT/runs.log" 2>&1 || echo "analysis of $run failed" | tee -a "$OUT/runs.log"
  done
fi
"$PY" -m runners.results "$OUT"/traces/*/ >"$OUT/results.md"
cat "$OUT/results.md"
echo "results: $OUT/results.md  traces: $OUT/traces  (total $(( SECONDS - started )) s)"
