#!/bin/bash
# One device call (~200 s of command time): ours (cmd/bench, prebuilt as bench-bin) and the serving
# engines' DSv4 prologue kernels (SGLang, vLLM) built from their public sources (src/) beside it,
# then timed with bench/engines.py on the same shapes, after the equal-work check on ours' cases.
#   bash .gpu-report/run.sh        (from the repository root; $OUT is where everything goes)
# Every step has a hard limit; a failed build or engine costs only its own part. Logs: $OUT/logs.tar.gz.
export PYTHONUNBUFFERED=1
G=.gpu-report
L=/tmp/logs; rm -rf $L $G/build; mkdir -p $L $G/build
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
END=${END_S:-188}                         # engines' timing stops by then (seconds since T0)
el() { echo $(( $(date +%s) - T0 )); }
step() { echo "[$(el) s] $*" | tee -a $L/steps.log; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $OUT/device.txt 2>&1
( { nvcc --version | tail -2; gcc --version | head -1
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cxx11abi', torch._C._GLIBCXX_USE_CXX11_ABI)"
  } > $OUT/versions.txt 2>&1 ) &

# The engines' builds, one process each, beside ours (the plugin kills its compiler at 120 s).
export ENGINES_BUILD_TIMEOUT_S=120
for e in sglang vllm; do
  ( timeout 130 python3 $G/engines_plugin.py --build $e > $L/build-$e.stdout 2>&1; rc=$?
    echo "[$(el) s] build $e: rc $rc" >> $L/steps.log; touch $L/done-$e ) &
done

step "ours: start"
timeout 60 $G/bench-bin --quick --kernels=false --graph=true --iteration=true --chain=false --host-cost=false \
  --models flash,pro --formats fp8_ue8m0 --gen-batches 1,8,32,256 --mtp 0,3 --ctx-tokens 4096,65536 \
  --graph-reps 30 --check-dir $L/cases --out $OUT/bench-go.json > $L/bench-go.log 2>&1
step "ours: rc $?"

# The lead's other GPU checks of the same call (the project's tests of new kernels), between ours
# and the engines' timing, while the builds still run on the CPU.
if [ -n "${EXTRA:-}" ]; then
  step "extra: start"
  timeout ${EXTRA_S:-50} bash $EXTRA > $OUT/extra.log 2>&1
  step "extra: rc $?"
fi

# Each engine in its own process (a fault in one cannot take the other's CUDA context), as soon as
# its build is done, the time left shared between the engines still to run; engines.py stops
# starting shapes at --budget-s and writes its JSON after every shape, so a kill at the hard limit
# keeps what was measured. The builds end by ~125 s whatever happens.
run_engines() {  # name, ENGINES_ONLY, seconds
  local name=$1 only=$2 secs=$3
  step "engines $name: ${secs} s"
  ENGINES_ONLY=$only timeout $secs python3 bench/engines.py --peers $G/engines_plugin.py --check-dir $L/cases \
    --ctx-tokens 4096,65536 --graph-reps 30 --out $OUT/engines-$name.json --budget-s $(( secs - 22 )) --verbose \
    > $L/engines-$name.log 2>&1
  step "engines $name: rc $?"
}
so_sglang=$G/build/sgl_dsv4.so; so_vllm=$G/build/vllm_dsv4.so
ran=0; pending="sglang vllm"
while [ -n "$pending" ]; do
  ready=""
  while [ -z "$ready" ] && [ $(el) -lt 132 ]; do
    for e in $pending; do [ -f $L/done-$e ] && { ready=$e; break; }; done
    [ -z "$ready" ] && sleep 1
  done
  if [ -z "$ready" ]; then step "builds not finished: $pending"; break; fi
  pending=$(for e in $pending; do [ $e != $ready ] && echo $e; done | xargs)
  so=so_$ready
  if [ ! -f ${!so} ]; then step "not built: $ready"; continue; fi
  others=0   # engines after this one that may still run: built, or still building
  for e in $pending; do so2=so_$e; { [ ! -f $L/done-$e ] || [ -f ${!so2} ]; } && others=$(( others + 1 )); done
  secs=$(( (END - $(el)) / (1 + others) ))
  if [ $secs -lt 25 ]; then step "no time left for $ready ($secs s)"; continue; fi
  step "built: $ready"
  run_engines $ready $ready $secs
  ran=$(( ran + 1 ))
done
[ $ran -eq 0 ] && run_engines none none 30   # the report with the build logs only

cp $G/build/*.log $L/ 2>/dev/null
timeout 25 python3 $G/summary.py --out $OUT --ours $OUT/bench-go.json --build $G/build --steps $L/steps.log \
  > $OUT/summary.txt 2>&1
step "summary: rc $?"
tar czf $OUT/logs.tar.gz -C /tmp --exclude=logs/cases logs
cat $OUT/summary.txt
echo "---- steps"; cat $L/steps.log
