#!/bin/bash
# scalefit sizes on all five sizes' real rows (sizes.csv), on the device's Xeon pinned to 2 cores:
# three times alone, then three times beside two CPU-bound processes on those same cores
export PYTHONPATH=$PWD OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
mkdir -p $OUT/x; lscpu | grep "Model name" > $OUT/x/t.txt
for i in 1 2 3; do /usr/bin/time -f "alone real %e user %U" taskset -c 0,1 python3 -m scalefit sizes sizes.csv --holdout large --json /tmp/s.json > $OUT/x/out.txt 2>> $OUT/x/t.txt; done
taskset -c 0 python3 -c "while True: pass" & taskset -c 1 python3 -c "while True: pass" &
for i in 1 2 3; do /usr/bin/time -f "loaded real %e user %U" taskset -c 0,1 python3 -m scalefit sizes sizes.csv --holdout large --json /tmp/s.json > /dev/null 2>> $OUT/x/t.txt; done
kill %1 %2
