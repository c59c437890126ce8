# Session 8, call 3: the early-segment change A/B (gpud-A: session 8's
# call-2 build, segments registered after the driver's start, one madvise
# for segment 0; new: hello's segments mapped and populated before the
# driver starts, madvise in 4 MiB pieces), then small jobs beside large ones
# under CUDA_DEVICE_MAX_CONNECTIONS 8 and 2.
#   bash .gpu-bundle/s8c.sh   (from the repository root, $OUT set)
B=.gpu-bundle
P=$B/lib/erlcuda/priv/gpud
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/smi.txt
cp $P $B/gpud-new
for v in A new A new; do
  cp $B/gpud-$v $P
  echo "== cold_start gpud-$v" >> $OUT/cold.log
  bash $B/run.sh eval 'erlcuda_bench:cold_start(5)' >> $OUT/cold.log 2>&1
done
for v in A new; do
  cp $B/gpud-$v $P
  ERLCUDA_BENCH_JSON=$OUT/br_$v.json bash $B/run.sh eval 'erlcuda_bench:main([buffers, restart])' > $OUT/br_$v.log 2>&1
done
cp $B/gpud-new $P
for c in 8 2; do
  CUDA_DEVICE_MAX_CONNECTIONS=$c bash $B/run.sh eval 's8_mixed:main()' > $OUT/mixed_c$c.log 2>&1
done
cd $OUT && tar czf r.tgz *.log *.txt *.json && rm -f *.log *.json
