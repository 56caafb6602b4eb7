#!/bin/bash
# The GPU machine's battery of checks and benches (development tool): each step has its own
# time limit and its own log under $OUT, so a hang or failure in one step leaves the others'
# results.
#   source .device/bin/gpu.sh && bash tools/gpu_steps.sh STEP [STEP ...]
# Steps: gated-quick gated-tests sanitize-gated racecheck-gated (RACE_CASES) bench-gated
#        bench-gated-q bench-gated-all
#        static-quick static-tests generic-tests sanitize-static sanitize-generic sanitize-reduce
#        bench-static bench-generic-large profile ncu-band routing (AB_DIRS) racecheck-routing routing-shape band candidates bulk-band bulk-wide relu2;
#        bulk-widths, split-small, mid-widths, mid-small, rows-256, mw4, generic-warps, ncu-routing,
#        land-generic (land-tests, land-sanitize), auto-ab (auto-all, band-ab: AB_DIRS, AB_TOKENS, AB_PRESETS),
#        land-candidate (AB_DIRS, AB_TOKENS, GATE),
#        split-ab (AB_DIRS, SPLIT_LAYERS), base-ab (AB_DIRS: whole older trees),
#        check-ab (AB_DIRS, CHECK_PRESETS, CHECK_TOKENS), ncu-l2 (AB_DIRS, L2_LAYERS),
#        dispatch-points (static-small, static-points, cutover-points), cutover-mid; pipeline-probe (PROBE_PRESETS, PROBE_TOKENS, PROBE_MODES, PROBE_CLOCKS); tail-probe;
#        drain-probe (DRAIN_PRESETS, DRAIN_TOKENS); tma-row-probe;
#        all-tests, all-tests-par, generic-tests-par; pack (last: $OUT as one results.tgz); verify (GPU tests + sanitizers), serving (soak + hf bench); ncu-tensor (NCU_LAYERS); A/B in one run against older
#        trees (AB_DIRS): static-ab, kernel-ab (AB_KERNEL), ncu-static-ab (PROFILE_ARGS)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# the run's commit label: pass FUSED_MOE_COMMIT=<sha> from the checkout. The device copy's git
# metadata can be an older commit's (once it said 18cbdd1 for 8b71d15), so
# without it the bench asks git itself, which marks such a tree "-dirty"
# the moe-static A/B step's layer presets and token counts
STATIC_PRESETS=${STATIC_PRESETS:-qwen3-30b-a3b deepseek-v3}
STATIC_TOKENS=${STATIC_TOKENS:-1 8 64}
FIVE="deepseek-v3 qwen3-30b-a3b qwen3.5-35b gpt-oss-120b nemotron-relu2"
BENCH=(python3 -c "import sys; from dispatcher.cli import main; sys.exit(main())" bench)
step() {  # name, limit_s, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n 4 "$OUT/$name.log"
}
tree_path() {  # tree dir (or "new"), packages: PYTHONPATH with those packages' sources first
  local d=$1 p pp=$PYTHONPATH; shift
  if [ $d != new ]; then
    for p in "$@"; do pp="$d/packages/$p/src:$pp"; done
  fi
  echo "$pp"
}
tree_label() {  # the commit label of a tree's bench JSON: ab_<sha> -> <sha>, "new" -> this run's
  if [ $1 = new ]; then echo "${FUSED_MOE_COMMIT:-}"; else basename $1 | sed 's/^ab_//'; fi
}
ab() {  # log prefix, limit_s, kernel, presets, tokens, packages: one bench per tree in $AB_DIRS
        # (those packages' sources first on PYTHONPATH; log <prefix>-<dir name>), then this tree's;
        # every tree runs the same seed, AB_SEED (default 1): the same routing and data; each
        # tree's bench JSON (labelled with its commit) beside its log, for benchmarks/
  local prefix=$1 limit=$2 kernel=$3 presets=$4 tokens=$5 pkgs=$6 d pp n
  for d in $AB_DIRS new; do
    pp=$(tree_path $d $pkgs)
    n="$prefix-$(basename $d)"
    step "$n" $limit env FUSED_MOE_COMMIT="$(tree_label $d)" PYTHONPATH="$pp" "${BENCH[@]}" --preset $presets --tokens $tokens --kernels $kernel --no-check --seed ${AB_SEED:-1} --json "$OUT/$n.json"
  done
}
generic_tests_started() {  # moe-generic's GPU suite in three parts and the layer suites, as
                          # background processes (all-tests-par, generic-tests-par wait for them)
  step tests-generic 560 python3 -m pytest packages/moe-generic -m gpu -q -k "not config_candidates" &
  step tests-generic-c01 560 python3 -m pytest packages/moe-generic -m gpu -q -k "config_candidates and (case0 or case1)" &
  step tests-generic-c23 560 python3 -m pytest packages/moe-generic -m gpu -q -k "config_candidates and not (case0 or case1)" &
  step tests-layer 560 python3 -m pytest tests dispatcher/tests -m gpu -q &
}
for s in "$@"; do
  case $s in
    static-quick) step static-quick 150 python3 tools/gpu_check.py --kernel static --sanitize ;;
    gated-quick) step gated-quick 200 python3 tools/gpu_check.py --kernel gated --sanitize ;;
    gated-tests) step gated-tests 200 python3 -m pytest packages/moe-gated -m gpu -q -x ;;
    all-tests)  # every GPU test in three steps: the whole suite outran one 400 s step at
                # 8f1fb8d (203 of 286 done; moe-generic alone holds 163)
      step tests-kernels 300 python3 -m pytest packages/moe-common packages/moe-gated packages/moe-static -m gpu -q
      step tests-generic 400 python3 -m pytest packages/moe-generic -m gpu -q
      step tests-layer 300 python3 -m pytest tests dispatcher/tests -m gpu -q ;;
    all-tests-par)  # the same suites as concurrent processes, moe-generic's in three parts (the
                    # suite is mostly compiles, which the GPU machine's 16 cores run side by side;
                    # at 4458254 the three suites took 131 / 426 / 213 s as three processes, the
                    # config candidates being 100 of moe-generic's 163; as these five, 200 s at
                    # 968d650, 210 s and more at 851a088: a call that runs it after the
                    # five-preset table needs ~250 s left)
      step tests-kernels 560 python3 -m pytest packages/moe-common packages/moe-gated packages/moe-static -m gpu -q &
      generic_tests_started
      wait ;;
    generic-tests-par)  # all-tests-par without the moe-common, moe-gated and moe-static suites
                        # (a change to moe-generic alone)
      generic_tests_started
      wait ;;
    sanitize-gated) step sanitize-gated 200 compute-sanitizer --tool memcheck --report-api-errors no python3 tools/gpu_check.py --kernel gated --sanitize ;;
    sanitize-reduce)  # the top-k reduce's own GPU test under memcheck
      step sanitize-reduce 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q -m gpu packages/moe-common/tests/test_topk_reduce_gpu.py ;;
    racecheck-gated) step racecheck-gated 240 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 9 python3 tools/gpu_check.py --kernel gated --sanitize --first ${RACE_CASES:-2} ;;
    bench-gated) step bench-gated 500 "${BENCH[@]}" --preset deepseek-v3 qwen3-30b-a3b gpt-oss-120b --tokens 2048 8192 --kernels moe-gated moe-generic --no-check --json "$OUT/bench-gated.json" ;;
    bench-gated-all) step bench-gated-all 400 "${BENCH[@]}" --preset qwen3-30b-a3b qwen3.5-35b deepseek-v3 gpt-oss-120b --tokens 128 512 2048 8192 16384 --kernels auto moe-gated moe-generic --no-check --json "$OUT/bench-gated-all.json" --plot "$OUT/bench-gated-all.png" ;;
    bench-gated-q) step bench-gated-q 400 "${BENCH[@]}" --preset deepseek-v3 qwen3-30b-a3b gpt-oss-120b qwen3.5-35b --tokens 2048 8192 --kernels moe-gated --no-check --json "$OUT/bench-gated-q.json" ;;
    routing)  # the routing's bench for each tree in $AB_DIRS (its moe-common first, log
              # routing-<dir name>) and for this one, then its GPU tests and memcheck
      for d in ${AB_DIRS:-}; do
        step "routing-$(basename $d)" 200 env PYTHONPATH="$(tree_path $d moe-common)" python3 tools/routing_bench.py
      done
      step routing 200 python3 tools/routing_bench.py
      step routing-tests 200 python3 -m pytest packages/moe-common -m gpu -q
      step sanitize-routing 300 compute-sanitizer --tool memcheck --report-api-errors no python3 -m pytest packages/moe-common/tests/test_routing_gpu.py -q ;;
    racecheck-routing)  # the routing's shared memory (since 4329626 its `order` is staged there
                        # between two CTA barriers) under racecheck, on its GPU test
      step racecheck-routing 300 compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 9 python3 -m pytest packages/moe-common/tests/test_routing_gpu.py -q ;;
    auto-512) step auto-512 200 "${BENCH[@]}" --preset qwen3-30b-a3b qwen3.5-35b deepseek-v3 gpt-oss-120b --tokens 512 --kernels auto --no-check --json "$OUT/auto-512.json" ;;
    gated-vs-generic) step gated-vs-generic 300 "${BENCH[@]}" --preset qwen3.5-35b qwen3-30b-a3b deepseek-v3 gpt-oss-120b --tokens 2048 --kernels moe-gated moe-generic --no-check --json "$OUT/gated-vs-generic.json" ;;
    ncu-gated) step ncu-gated 400 ncu --clock-control none --kernel-name regex:GatedGemm --launch-skip 2 -c 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" python3 tools/profile_layer.py --kernel gated --tokens 4096 --experts 32 --calls 1 ;;
    ncu-gated-src)
      step ncu-gated-src 400 ncu --clock-control none --kernel-name regex:GatedGemm --launch-skip 2 -c 1 --section WarpStateStats --section SourceCounters -o "$OUT/gated" python3 tools/profile_layer.py --kernel gated --tokens 4096 --experts 32 --calls 1
      step ncu-gated-sass 200 ncu --import "$OUT/gated.ncu-rep" --page source --csv --print-source sass ;;
    split-gated)
      for pr in ${SPLIT_PRESETS:-deepseek-v3 qwen3-30b-a3b gpt-oss-120b}; do
        step "split-gated-$pr" 200 python3 tools/profile_split.py --kernel gated --preset $pr --tokens 8192
      done ;;
    launch-cost) step launch-cost 200 python3 tools/launch_cost.py ;;
    gated-clocks)  # SM clock, power and throttle reasons (nvidia-smi every 200 ms) while a bench replays
      for k in ${CLOCK_KERNELS:-moe-gated torch-bf16}; do
        nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 200 > "$OUT/clocks-$k.csv" 2>&1 &
        smi=$!
        step "clocks-$k" 300 "${BENCH[@]}" --preset ${CLOCK_PRESET:-deepseek-v3} --tokens 8192 --kernels $k --no-check
        kill $smi
      done ;;
    static-ab)  # same run: moe-static (and moe-common) from each tree in $AB_DIRS (else $AB_DIR),
                # then this tree's (log static-ab-<dir name>, static-ab-new); STATIC_PRESETS, STATIC_TOKENS
      AB_DIRS=${AB_DIRS:-$AB_DIR} ab static-ab 300 moe-static "$STATIC_PRESETS" "$STATIC_TOKENS" \
        "moe-common moe-static" ;;
    kernel-ab)  # the same for AB_KERNEL (default moe-gated) with every package's sources from each
                # tree (log kernel-ab-<kernel>-<dir name>); AB_PRESETS, AB_TOKENS
      ab "kernel-ab-${AB_KERNEL:-moe-gated}" 400 "${AB_KERNEL:-moe-gated}" \
        "${AB_PRESETS:-deepseek-v3 qwen3-30b-a3b gpt-oss-120b}" "${AB_TOKENS:-2048 8192}" \
        "$(cd packages && echo *)" ;;
    static-tests) step static-tests 300 python3 -m pytest packages/moe-static -m gpu -q -x ;;
    generic-tests) step generic-tests 400 python3 -m pytest packages/moe-generic tests dispatcher/tests -m gpu -q ;;
    sanitize-static) step sanitize-static 200 compute-sanitizer --tool memcheck --report-api-errors no python3 tools/gpu_check.py --kernel static --sanitize ;;
    sanitize-generic) step sanitize-generic 200 compute-sanitizer --tool memcheck --report-api-errors no python3 tools/gpu_check.py --sanitize ;;
    bench-generic-bar) step bench-generic-bar 300 "${BENCH[@]}" --preset deepseek-v3 qwen3-30b-a3b --tokens 1 8192 --kernels moe-generic torch-bf16 --json "$OUT/bench-generic-bar.json" ;;
    bench-generic-big) step bench-generic-big 300 "${BENCH[@]}" --preset deepseek-v3 qwen3-30b-a3b --tokens 8192 --kernels moe-generic moe-gated torch-bf16 --no-check --json "$OUT/bench-generic-big.json" ;;
    bench-static-q) step bench-static-q 300 "${BENCH[@]}" --preset qwen3-30b-a3b deepseek-v3 --tokens 1 8 64 --kernels moe-static --no-check ;;
    bench-static) step bench-static 400 "${BENCH[@]}" --preset qwen3-30b-a3b deepseek-v3 --tokens 1 2 4 8 16 32 64 128 --kernels moe-static moe-generic --json "$OUT/bench-static.json" --plot "$OUT/bench-static.png" ;;
    bench-static-all) step bench-static-all 500 "${BENCH[@]}" --preset qwen3.5-35b gpt-oss-120b nemotron-relu2 --tokens 1 2 4 8 16 32 64 128 --kernels moe-static moe-generic --json "$OUT/bench-static-all.json" --plot "$OUT/bench-static-all.png" ;;
    bench-nemotron) step bench-nemotron 400 "${BENCH[@]}" --preset nemotron-relu2 --tokens 512 2048 8192 --kernels auto torch-bf16 --no-check --json "$OUT/bench-nemotron.json" ;;
    ncu-generic)  # FC1 of the second call (GroupedGemm launches alternate FC1, FC2)
      step "ncu-generic${NCU_TAG:-}" 300 ncu --clock-control none --kernel-name regex:GroupedGemm --launch-skip 2 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed" python3 tools/profile_layer.py --kernel generic --tokens 4096 --experts 32 --calls 2 ;;
    bench-large) step bench-large 400 "${BENCH[@]}" --preset deepseek-v3 qwen3-30b-a3b --tokens 512 2048 8192 --kernels auto torch-bf16 --no-check --json "$OUT/bench-large.json" ;;
    ncu-stalls) step ncu-stalls 300 ncu --clock-control none --kernel-name regex:StaticMoE --launch-skip 1 -c 1 --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" python3 tools/profile_layer.py ;;
    ncu-static2)  # PROFILE_ARGS: the layer (see ncu-static-src); pipe counts and utilization
      step "ncu-static2${NCU_TAG:-}" 300 ncu --clock-control none --kernel-name regex:StaticMoE --launch-skip 1 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:smsp__inst_executed_pipe_.*\.sum,sm__inst_executed.sum,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active" python3 tools/profile_layer.py ${PROFILE_ARGS:-} ;;
    ncu-static-src)  # PROFILE_ARGS: the layer, e.g. "--experts 128 --hidden 2048 --intermediate 768 --tokens 1" (Qwen3-30B-A3B T=1)
      step ncu-static-src 400 ncu --clock-control none --kernel-name regex:StaticMoE --launch-skip 1 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters -o "$OUT/static" python3 tools/profile_layer.py ${PROFILE_ARGS:-}
      step ncu-static-sass 200 ncu --import "$OUT/static.ncu-rep" --page source --csv --print-source sass
      step ncu-static-details 200 ncu --import "$OUT/static.ncu-rep" --page details ;;
    ncu-static-ab)  # source counters of moe-static from each tree in $AB_DIRS and this one, on the
                    # layer PROFILE_ARGS: per tree the details page and the SASS summary
                    # (tools/ncu_sass_top.py), logs ncu-ab<NCU_TAG>-<dir name>-{details,top}
      for d in $AB_DIRS new; do
        pp=$(tree_path $d moe-common moe-static)
        n=ncu-ab${NCU_TAG:-}-$(basename $d)
        step $n-details 300 env PYTHONPATH="$pp" ncu --clock-control none --kernel-name regex:StaticMoE --launch-skip 1 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters -o "/tmp/$n" -f python3 tools/profile_layer.py ${PROFILE_ARGS:-}
        ncu --import "/tmp/$n.ncu-rep" --page details >> "$OUT/$n-details.log" 2>&1
        ncu --import "/tmp/$n.ncu-rep" --page source --csv --print-source sass > "/tmp/$n.csv" 2>&1
        step $n-top 100 python3 tools/ncu_sass_top.py "/tmp/$n.csv"
      done ;;
    routing-shape)  # moe-gated on random against balanced routing (tools/gated_routing_shape.py)
      step routing-shape-ds 200 python3 tools/gated_routing_shape.py --preset deepseek-v3 --tokens 8192 8704
      step routing-shape-oss 120 python3 tools/gated_routing_shape.py --preset gpt-oss-120b --tokens 8192 ;;
    ncu-static) step ncu-static 300 ncu --clock-control none --kernel-name regex:StaticMoE --launch-skip 1 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy python3 tools/profile_layer.py ;;
    verify)  # what a landing needs from the GPU: every GPU test, then the property profile under
             # the three sanitizers (docs/RELIABILITY.md), each tool's log apart
      bash "$0" all-tests-par
      # synccheck tracks a fixed number of barriers per block unless told more: the kernels'
      # mbarrier rings overflowed its default (2026-12-02, benchmarks/HISTORY.md)
      for tool in memcheck racecheck "synccheck --num-cuda-barriers 512"; do
        step "verify-${tool%% *}" 300 env MOE_PROPERTY_EXAMPLES=${VERIFY_EXAMPLES:-20} compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 -m pytest -q -m gpu dispatcher/tests/test_properties.py
      done ;;
    land-candidate)  # a kernel candidate in one device call (a refused machine start costs
                     # 90-180 s of device time): band-ab against $AB_DIRS at AB_TOKENS (default
                     # 512 1024), and only when the geomean of this tree over the first of them
                     # is <= GATE (default 0.995) the sanitizers and every GPU test. At 8c84a7a
                     # on an H100: 114 + 103 + 234 s; the five-preset table (auto-all, 127 s)
                     # and base-ab (201 s) fit the next call, not this one's 600 s. Wrap it in
                     # `timeout` and run `pack` after it
      AB_TOKENS=${AB_TOKENS:-512 1024} bash "$0" band-ab
      base=$(basename ${AB_DIRS%% *})
      python3 tools/bench_table.py "$OUT/band-ab-new.json" --against "$OUT/band-ab-$base.json" \
        --gate ${GATE:-0.995} > "$OUT/gate.log" 2>&1
      rc=$?
      echo "== gate rc=$rc"; tail -n 4 "$OUT/gate.log"
      [ $rc = 0 ] && bash "$0" sanitize-generic sanitize-gated sanitize-static all-tests-par ;;
    serving)  # the soak runs (tools/soak.py) and the transformers experts bench (tools/hf_bench.py;
              # the GPU image has transformers 5.17, the lock 5.24: stage 5.24 with EXTRA_WHEELS if
              # its experts interface differs)
      step soak-qwen 260 python3 tools/soak.py --seconds 180 --preset qwen3-30b-a3b --max-tokens 512 --json "$OUT/soak.json"
      step soak-oss 260 python3 tools/soak.py --seconds 180 --preset gpt-oss-120b --max-tokens 2048 --json "$OUT/soak-oss.json"
      step hf-bench 300 python3 tools/hf_bench.py --preset qwen3-30b-a3b --layers 4 --shapes 1x1 32x1 512x1 1x2048 --json "$OUT/hf-bench.json" ;;
    band)  # moe-generic's tile widths forced against the dispatcher's choice in the 128..2048 band
      step band 400 python3 tools/band_probe.py --preset ${BAND_PRESETS:-deepseek-v3 qwen3-30b-a3b qwen3.5-35b gpt-oss-120b nemotron-relu2} --tokens ${BAND_TOKENS:-128 256 512 1024 2048} --bn 8 16 32 64 --kernels auto ${AB_SEED:+--seed $AB_SEED} --json "$OUT/band.json" ;;
    generic-warps)  # moe-generic's 32-token tiles as 8 MMA warps x 1 group against 4 x 2: ptxas
                    # (sm_90a, on the CPU) gives FC1 56 registers (4 CTAs, 32 MMA warps per SM)
                    # and FC2 NVFP4 72 (3 CTAs) against 96 (4 CTAs, 16 MMA warps), at 11% more
                    # instructions per weight (the B fragments' loads are per warp). Its GPU test
                    # forced against the reference, then timed at 4-24 routed rows per expert,
                    # in both GEMMs and in each alone. At 1c58373: slower at all 15 points, 1-8%
                    # (dropped)
      step generic-warps-tests 300 python3 -m pytest -q -m gpu $(for c in 0 1 2 3; do echo "packages/moe-generic/tests/test_generic_gpu.py::test_config_candidates_match_reference[case$c-32-mw=1,warps=8]"; done)
      step generic-warps 400 python3 tools/band_probe.py --preset $FIVE --tokens ${BAND_TOKENS:-128 256 512} --bn --kernels auto --config '32:mw=1,warps=8' '32/fc1:mw=1,warps=8' '32/fc2:mw=1,warps=8' --seed ${AB_SEED:-1} --json "$OUT/generic-warps.json" ;;
    candidates)  # moe-generic's config candidates (tests/test_generic_gpu.py) forced against
                 # the reference, then timed against the defaults in the band
      step candidates-tests 300 python3 -m pytest packages/moe-generic -m gpu -q -k config_candidates
      step candidates-band 400 python3 tools/band_probe.py --preset ${BAND_PRESETS:-deepseek-v3 qwen3-30b-a3b qwen3.5-35b gpt-oss-120b nemotron-relu2} --tokens ${BAND_TOKENS:-64 128 256 512 1024} --bn --kernels auto --config 32:producer_warps=0,stages=4 32:stages=4 '*:producer_warps=1' 32:mw=1,warps=8 --seed ${AB_SEED:-1} --json "$OUT/candidates-band.json" ;;
    bulk-band)  # after 268912f (32-token tiles by bulk copy, 8-12% faster): what it moves at
                # 4-16 routed rows per expert. 1. the bulk-copy producer at every width against
                # the reference; 2. moe-generic's widths forced (runner.pick_bn) and the bulk
                # producer at the 8- and 16-token tiles timed; 3. the bulk producer where K has
                # a tail (gpt-oss-120b FC1, H = 2880: it zeroes the tail itself)
      step bulk-tests 300 python3 -m pytest packages/moe-generic -m gpu -q -k "(config_candidates or tall_tile) and producer_bulk"
      step bulk-band 500 python3 tools/band_probe.py --preset ${BAND_PRESETS:-deepseek-v3 qwen3-30b-a3b qwen3.5-35b gpt-oss-120b nemotron-relu2} --tokens ${BAND_TOKENS:-64 128 256} --bn 8 16 32 --kernels auto --config '8:producer_warps=1,stages=3,producer_bulk=True' '16:producer_warps=1,stages=3,producer_bulk=True' --seed ${AB_SEED:-1} --json "$OUT/bulk-band.json"
      step bulk-tail 200 python3 tools/band_probe.py --preset gpt-oss-120b --tokens 256 512 1024 --bn --config '32/fc1:producer_bulk=True' --seed ${AB_SEED:-1} --json "$OUT/bulk-tail.json" ;;
    bulk-wide)  # 32-64 routed rows per expert: moe-generic (its own widths; the 32-token tiles
                # forced; the bulk producer at the 64-token tiles) against moe-gated, for the
                # cutover (moe_gated.limits.CUTOVER_ROWS_PER_EXPERT) and the 64-token producer
      step bulk-wide 550 python3 tools/band_probe.py --preset ${BAND_PRESETS:-deepseek-v3 qwen3-30b-a3b qwen3.5-35b gpt-oss-120b nemotron-relu2} --tokens ${BAND_TOKENS:-512 1024 2048} --bn 32 --kernels moe-generic moe-gated --config '64:producer_warps=1,producer_bulk=True' --seed ${AB_SEED:-1} --json "$OUT/bulk-wide.json" ;;
    bulk-widths)  # the bulk producer at the 8-, 16- and 64-token tiles (GPU-tested at 2d9a234,
                  # not timed), each width forced, against the dispatcher's 32-token tiles
      step bulk-widths 560 python3 tools/band_probe.py --preset $FIVE --tokens ${BAND_TOKENS:-64 128 256 1024 2048} --bn --kernels auto --config '8:producer_warps=1,stages=3,producer_bulk=True' '16:producer_warps=1,stages=3,producer_bulk=True' '64:producer_warps=1,producer_bulk=True' --seed ${AB_SEED:-1} --json "$OUT/bulk-widths.json" ;;
    split-small)  # where the time goes for the small-expert presets in the band (issue 29's
                  # widest gaps): per-kernel time under the bench's conditions (graph replay),
                  # moe-generic at 16-32 routed rows per expert; the y round trip is P x H x 4
                  # bytes (bf16 since b069cd2; Qwen3.5-35B T=1024: 67 MB against 453 MB of
                  # weights)
      for t in 256 512 1024; do
        step "split-qwen3-$t" 120 python3 tools/profile_split.py --kernel generic --preset qwen3-30b-a3b --tokens $t --graph
        step "split-qwen35-$t" 120 python3 tools/profile_split.py --kernel generic --preset qwen3.5-35b --tokens $t --graph
      done ;;
    mid-widths)  # the 48-token tiles (runner.MID_MIN_ROWS) at 16-32 mean routed rows per
                 # expert, where 32-token tiles cut an expert of ~32 rows in two and decode its
                 # weights twice: 1. the candidates against the reference; 2. the widths forced
                 # against the dispatcher's (at ea2bbc3 the step also forced 40 tokens, by bulk
                 # copies then: between 32 and 48 everywhere)
      step mid-tests 240 python3 -m pytest packages/moe-generic -m gpu -q -k "config_candidates and 48"
      step mid-widths 330 python3 tools/band_probe.py --preset $FIVE --tokens ${BAND_TOKENS:-512 1024} --bn 32 48 --kernels auto --config '48:stages=3' '48:mw=1,warps=8' --seed ${AB_SEED:-1} --json "$OUT/mid-widths.json" ;;
    rows-256)  # more MMA warps per SM at the 16- and 32-row points: the 48-token tiles compiled
               # for 4 CTAs (min_ctas=4, 96 registers), and 256-row tiles of 8 warps x 2 groups
               # (each token row read from L2 once per 256 weight rows, not 128; 2 CTAs per SM at
               # 96 registers) at 32 and 48 tokens. 1. against the reference; 2. timed against the
               # dispatcher's on the presets whose GEMM rows divide by 256, gpt-oss-120b for the
               # first (ROWS_PART: small = tests + Qwen3-30B-A3B + gpt-oss-120b, large = the rest).
               # At b57a004: min_ctas=4 level, the 256-row tiles slower at every point (dropped)
      v256='*:warps=8,mw=2,min_ctas=2'
      if [ "${ROWS_PART:-small}" = small ]; then
        step rows-tests 300 python3 -m pytest packages/moe-generic -m gpu -q -k "config_candidates and (min_ctas or 32-warps) and not producer"
        step rows-small 240 python3 tools/band_probe.py --preset qwen3-30b-a3b --tokens 256 512 --bn --kernels auto --config '*:min_ctas=4' "$v256" "$v256,stages=3" --seed 1 --json "$OUT/rows-small.json"
        step rows-oss 150 python3 tools/band_probe.py --preset gpt-oss-120b --tokens 1024 --bn --config '*:min_ctas=4' --seed 1 --json "$OUT/rows-oss.json"
      else
        step rows-large 500 python3 tools/band_probe.py --preset qwen3.5-35b deepseek-v3 --tokens 512 1024 --bn --kernels auto --config '*:min_ctas=4' "$v256" "$v256,stages=3" --seed 1 --json "$OUT/rows-large.json"
      fi ;;
    mw4)  # the 32-token tiles as 2 MMA warps x 4 groups (the same 128 x 32 tile; each ldmatrix'd
          # B fragment feeds 4 MMAs instead of 2; 168 registers, 4 CTAs per SM: 8 MMA warps
          # against 16): 1. against the reference; 2. at the 8- to 24-row points. At ac598e3:
          # slower at all 10 points, 2-21% (dropped)
      step mw4-tests 200 python3 -m pytest -m gpu -q $(for c in 0 1 2 3; do echo "packages/moe-generic/tests/test_generic_gpu.py::test_config_candidates_match_reference[case$c-32-warps=2,mw=4]"; done)
      step mw4-band 400 python3 tools/band_probe.py --preset $FIVE --tokens 256 512 --bn --kernels auto --config '32:warps=2,mw=4' --seed 1 --json "$OUT/mw4-band.json" ;;
    ncu-routing)  # the single-CTA routing kernel (moe_common.cute.routing.RoutingKernel) at
                  # ROUTING_LAYER (preset:T), where split-small timed it at 8-13 us
      IFS=: read -r pre tok <<< "${ROUTING_LAYER:-qwen3-30b-a3b:1024}"
      step ncu-routing 200 ncu --clock-control none --kernel-name regex:RoutingKernel --launch-skip 1 -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" python3 tools/profile_split.py --kernel generic --preset $pre --tokens $tok --calls 2 --no-profiler ;;
    land-tests)  # a moe-generic change's GPU tests and the dispatcher's (the config candidates
                 # apart: bulk-band, candidates, mid-widths); with land-sanitize: land-generic
      step land-tests 330 python3 -m pytest packages/moe-generic tests dispatcher/tests -m gpu -q -k "not config_candidates" ;;
    land-sanitize)  # memcheck and racecheck on moe-generic's small cases (every producer path)
      for tool in memcheck racecheck; do
        step "land-$tool" 150 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 python3 tools/gpu_check.py --kernel generic --sanitize
      done ;;
    land-generic) bash "$0" land-tests land-sanitize ;;
    auto-ab) bash "$0" auto-all band-ab ;;  # the current table, then its same-run A/B
    auto-all)  # the five presets at the dispatcher's choice at all 10 T (the current table)
      step auto-all 330 "${BENCH[@]}" --preset $FIVE --tokens 1 8 32 64 128 256 512 1024 2048 8192 --kernels auto --no-check --seed 1 --json "$OUT/auto-all.json"
      step auto-all-bars 30 python3 tools/bench_table.py "$OUT/auto-all.json" --bars ;;  # BENCHMARKS.md's table, issue 29's bars
    check-ab)  # the bench's check against the fp32 reference (rel L2, cosine) for each tree in
               # $AB_DIRS and this one, same seed: what a numerics change moves
      for d in $AB_DIRS new; do
        step "check-ab-$(basename $d)" 250 env FUSED_MOE_COMMIT="$(tree_label $d)" PYTHONPATH="$(tree_path $d $(cd packages && echo *))" "${BENCH[@]}" --preset ${CHECK_PRESETS:-qwen3-30b-a3b gpt-oss-120b nemotron-relu2} --tokens ${CHECK_TOKENS:-128 512 2048} --kernels auto --seed 1 --json "$OUT/check-ab-$(basename $d).json"
      done ;;
    band-ab)  # each tree in $AB_DIRS at AB_TOKENS (the points a change moves; AB_PRESETS, default
              # the five), then this tree at the same points: both halves run the same token
              # list (a point's time depends on the work before it: at e68442e unchanged points
              # read up to 5% apart between a full sweep and a short one)
      for d in $AB_DIRS new; do
        step "band-ab-$(basename $d)" 250 env FUSED_MOE_COMMIT="$(tree_label $d)" PYTHONPATH="$(tree_path $d $(cd packages && echo *))" "${BENCH[@]}" --preset ${AB_PRESETS:-$FIVE} --tokens ${AB_TOKENS:-64 128 256 512 1024 2048} --kernels auto --no-check --seed 1 --json "$OUT/band-ab-$(basename $d).json"
      done ;;
    base-ab)  # issue 29's last bar: the five presets at the bench's default T from each whole
              # tree in $AB_DIRS (its dispatcher too: an older moe-common does not fit today's
              # dispatcher; bench.py's protocol is the same since 8b6b63d), then this tree
      for d in $AB_DIRS new; do
        pp=$(tree_path $d $(cd packages && echo *))
        [ $d != new ] && pp="$d/dispatcher/src:$pp"
        step "base-ab-$(basename $d)" 300 env FUSED_MOE_COMMIT="$(tree_label $d)" PYTHONPATH="$pp" "${BENCH[@]}" --preset $FIVE --tokens 1 8 32 128 512 2048 8192 --kernels auto --no-check --seed 1 --json "$OUT/base-ab-$(basename $d).json"
      done ;;
    split-ab)  # per-kernel time under graph replay (tools/profile_split.py --graph) of each tree
               # in $AB_DIRS, then this tree, at SPLIT_LAYERS (kernel:preset:T): what a kernel
               # change moves in FC1, FC2 and the small kernels apart
      for d in $AB_DIRS new; do
        for kpt in ${SPLIT_LAYERS:-generic:qwen3.5-35b:512 generic:qwen3-30b-a3b:256 generic:deepseek-v3:512}; do
          IFS=: read -r kern pre tok <<< "$kpt"
          step "split-ab-$(basename $d)-$pre-$tok" 150 env PYTHONPATH="$(tree_path $d $(cd packages && echo *))" python3 tools/profile_split.py --kernel $kern --preset $pre --tokens $tok --graph
        done
      done ;;
    mid-small)  # the 48-token tiles as 8 warps x 1 group on the small-expert presets (faster
                # there at 3 stages in mid-widths), against the dispatcher's 4 x 2
      step mid-small 200 python3 tools/band_probe.py --preset qwen3-30b-a3b qwen3.5-35b --tokens 512 1024 --bn --kernels auto --config '48:mw=1,warps=8' --seed ${AB_SEED:-1} --json "$OUT/mid-small.json" ;;
    dispatch-points)  # each kernel forced where the dispatcher's cutovers lie (JSON for
                      # tests/test_dispatch_measured.py): moe-static against moe-generic at
                      # T = 1-128, moe-generic against moe-gated at T = 512-2048
      bash "$0" static-small static-points cutover-points ;;
    static-points) step static-points 200 "${BENCH[@]}" --preset $FIVE --tokens 32 64 128 --kernels moe-static moe-generic --no-check --seed 1 --json "$OUT/static-points.json" ;;
    static-small) step static-small 300 "${BENCH[@]}" --preset $FIVE --tokens 1 2 4 8 16 24 --kernels moe-static moe-generic --no-check --seed 1 --json "$OUT/static-small.json" ;;
    cutover-mid)  # each kernel forced between the 16 and 32 routed rows per expert of
                  # cutover-points: 20, 24 and 28 rows (T x k / E) on every preset (T x k / E is
                  # T / 32 on the first three presets, T / 16 on Qwen3-30B-A3B)
      step cutover-mid-32 250 "${BENCH[@]}" --preset deepseek-v3 qwen3.5-35b gpt-oss-120b --tokens 640 768 896 --kernels moe-generic moe-gated --no-check --seed 1 --json "$OUT/cutover-mid-32.json"
      step cutover-mid-16 120 "${BENCH[@]}" --preset qwen3-30b-a3b --tokens 320 384 448 --kernels moe-generic moe-gated --no-check --seed 1 --json "$OUT/cutover-mid-16.json"
      step cutover-mid-relu2 120 "${BENCH[@]}" --preset nemotron-relu2 --tokens 427 512 598 --kernels moe-generic moe-gated --no-check --seed 1 --json "$OUT/cutover-mid-relu2.json" ;;
    cutover-points) step cutover-points 300 "${BENCH[@]}" --preset $FIVE --tokens 512 1024 2048 --kernels moe-generic moe-gated --no-check --seed 1 --json "$OUT/cutover-points.json" ;;
    relu2)  # moe-gated's relu2 path: its GPU tests, then nemotron-relu2 with each kernel forced
      step relu2-tests 300 python3 -m pytest packages/moe-gated -m gpu -q -k "relu2 or geometry"
      step relu2-bench 400 "${BENCH[@]}" --preset nemotron-relu2 --tokens 256 512 1024 2048 8192 --kernels auto moe-gated moe-generic --no-check --json "$OUT/relu2-bench.json" ;;
    pipeline-probe)  # moe-gated with one side of its pipeline taken away (the consumers alone,
                     # the copies alone) and candidates, against the kernel as shipped
                     # (tools/pipeline_probe.py: modes full consumers producer onecopy width48
                     # width16 width80 nodecode nomma mmaonly noepilogue nob halfb bytescales
                     # padzero padnoise fc1ladder-W-W-...;
                     # PROBE_KERNEL=moe-generic or moe-static: full bytescales)
      n=pipeline-probe${PROBE_KERNEL:+-$PROBE_KERNEL}
      step $n 560 python3 tools/pipeline_probe.py --preset ${PROBE_PRESETS:-deepseek-v3 qwen3-30b-a3b} --tokens ${PROBE_TOKENS:-512 1024 2048} ${PROBE_MODES:+--modes $PROBE_MODES} ${PROBE_KERNEL:+--kernel $PROBE_KERNEL} ${PROBE_CLOCKS:+--clocks} --seed 1 --json "$OUT/$n.json" ;;
    tail-probe)  # moe-gated's last wave: DeepSeek-V3's matrices at 32 routed rows per expert
                 # (T = 4E) with E = 256, 264, 248 experts, i.e. FC1 items of 256 rows 4096, 4224,
                 # 3968 on 132 SMs (31.0, 32.0, 30.1 waves; FC2 54.3, 56.0, 52.6): the time
                 # follows E if the queue balances the items, the rounded-up waves if the last
                 # wave's few items run alone (E=264 then costs what E=256 does). At 5af6ac3 on an
                 # H100: per expert within 0.15% at all three (benchmarks/HISTORY.md, 2026-12-06)
      for et in 256:1024 264:1056 248:992; do
        step tail-probe-${et%:*} 150 "${BENCH[@]}" --preset deepseek-v3 --experts ${et%:*} --tokens ${et#*:} --kernels moe-gated --no-check --seed 1 --json "$OUT/tail-probe-${et%:*}.json"
      done ;;
    drain-probe)  # moe-gated's idle SMs at each GEMM's start and end (tools/drain_probe.py),
                  # beside the per-kernel split of one of its points under graph replay. At
                  # 1e99d1f on an H100: DeepSeek-V3 T=1024 1.7% of the call, 3.5-6.3% of each
                  # GEMM at the small-expert presets (benchmarks/HISTORY.md, 2026-12-06)
      step drain-probe 400 python3 tools/drain_probe.py --preset ${DRAIN_PRESETS:-deepseek-v3 qwen3.5-35b qwen3-30b-a3b} --tokens ${DRAIN_TOKENS:-512 1024 2048} --seed 1 --json "$OUT/drain-probe.json"
      step drain-split 200 python3 tools/profile_split.py --kernel gated --preset deepseek-v3 --tokens 1024 --graph ;;
    tma-row-probe)  # FC1's token rows by one tensor-map copy per row: placement and rate. At
                    # 4c44bb6 on an H100: placement right, ~21 ns per copy per issuing warp
      step tma-row-probe 200 python3 tools/tma_row_probe.py --json "$OUT/tma-row-probe.json" ;;
    profile) step profile 200 python3 tools/profile_split.py --preset deepseek-v3 --tokens 8192 ;;
    ncu-band)  # where the band's time goes, per SASS line: FC1 and FC2 of one call at each of
               # BAND_LAYERS (kernel:preset:T), warp stalls and smem wavefronts by line
      for kpt in ${BAND_LAYERS:-generic:deepseek-v3:512 generic:qwen3-30b-a3b:256 generic:deepseek-v3:128 gated:deepseek-v3:1024 gated:qwen3-30b-a3b:512}; do
        IFS=: read -r kern pre tok <<< "$kpt"
        n=ncu-band-$kern-$pre-$tok
        rx=$([ $kern = gated ] && echo GatedGemm || echo GroupedGemm)
        step $n 300 ncu --clock-control none --kernel-name regex:$rx --launch-skip 2 -c 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters -o "/tmp/$n" -f python3 tools/profile_split.py --kernel $kern --preset $pre --tokens $tok --calls 1 --no-profiler
        ncu --import "/tmp/$n.ncu-rep" --page details >> "$OUT/$n.log" 2>&1
        ncu --import "/tmp/$n.ncu-rep" --page source --csv --print-source sass > "/tmp/$n.csv" 2>&1
        step $n-top 100 python3 tools/ncu_sass_top.py "/tmp/$n.csv"
      done ;;
    ncu-l2)  # DRAM bytes read and written and the L2 hit rate of each kernel of one eager call,
             # the fourth (after the compiling call and two more, which leave the L2 as a steady
             # stream of calls does; ncu without its L2 flush), for each tree in $AB_DIRS and this
             # one, at L2_LAYERS (kernel:preset:T, at most 8192 routed pairs: routing, [row
             # scatter,] FC1, FC2, reduce): what the L2 eviction priorities move
      for d in $AB_DIRS new; do
        for kpt in ${L2_LAYERS:-gated:qwen3.5-35b:1024 generic:qwen3.5-35b:512 gated:deepseek-v3:1024}; do
          IFS=: read -r kern pre tok <<< "$kpt"
          per=$([ $kern = gated ] && echo 5 || echo 4)
          step "ncu-l2-$(basename $d)-$kern-$pre-$tok" 200 env PYTHONPATH="$(tree_path $d $(cd packages && echo *))" ncu --cache-control none --clock-control none --kernel-name regex:cutlass --launch-skip $((3 * per)) -c $per --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum python3 tools/profile_split.py --kernel $kern --preset $pre --tokens $tok --calls 3 --no-profiler
        done
      done ;;
    ncu-tensor)  # moe-gated's FC1 and FC2 at NCU_LAYERS (preset:T): the tensor pipe's busy share,
                 # issue activity and warp stalls (are the narrow tiles bound by their wgmmas?)
      for pt in ${NCU_LAYERS:-qwen3-30b-a3b:512 deepseek-v3:1024 qwen3-30b-a3b:8192}; do
        IFS=: read -r pre tok <<< "$pt"
        step ncu-tensor-$pre-$tok 240 ncu --clock-control none --kernel-name regex:GatedGemm --launch-skip 2 -c 2 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --metrics "regex:sm__pipe_tensor.*_cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_tensor.*\.sum,smsp__issue_active.avg.pct_of_peak_sustained_active" python3 tools/profile_split.py --kernel gated --preset $pre --tokens $tok --calls 1 --no-profiler
      done ;;
    pack)  # last: every file under $OUT into one results.tgz (a device call brings back at
           # most 8 files; the A/B calls of e453874 and 4329626 lost JSONs to that)
      tar -czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete &&
        mv /tmp/results.tgz "$OUT/" && echo "== pack: $OUT/results.tgz" ;;
    *) echo "unknown step $s" ;;
  esac
done
