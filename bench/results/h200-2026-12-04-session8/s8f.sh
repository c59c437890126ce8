#!/bin/bash
# Session 8, call 7: what slows cuInit inside gpud's start (130-150 ms there,
# ~100 ms in a bare process)? The same binaries, cold_start(5) under four
# environments, two rounds: base; S8_NOPOP (gpud-var skips populating its
# page tables); S8_NOPREFAULT (s8var/erlcuda_device.beam skips the VM's
# pre-fault of the arena); both.
#   bash .gpu-bundle/s8f.sh   (from the repository root, $OUT set)
B=$(pwd)/.gpu-bundle
cp $B/gpud-var $B/lib/erlcuda/priv/gpud
E="code:add_patha(\"$B/s8var\"), erlcuda_bench:cold_start(5)"
for r in 1 2; do
  for v in base nopop noprefault none; do
    case $v in
      base) env=() ;; nopop) env=(S8_NOPOP=1) ;;
      noprefault) env=(S8_NOPREFAULT=1) ;; none) env=(S8_NOPOP=1 S8_NOPREFAULT=1) ;;
    esac
    echo "== $v round $r" >> $OUT/cold.log
    env "${env[@]}" bash $B/run.sh eval "$E" >> $OUT/cold.log 2>&1
  done
done
grep -E "^== |^cold: |^restart: " $OUT/cold.log
