#!/bin/bash
# the across-size fit's time on the device's Xeon, 2 pinned cores, alone and beside a CPU hog
export PYTHONPATH=$PWD OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 MKL_NUM_THREADS=2
mkdir -p $OUT/cpu; cd $PWD
lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/cpu/lscpu.txt
python3 -c "import numpy,scipy,pandas,matplotlib;print(numpy.__version__,scipy.__version__,pandas.__version__,matplotlib.__version__)" >> $OUT/cpu/lscpu.txt
{ cat results/scale-gpu3/sizes-smaller.csv; tail -n +2 results/scale-gpu3/sizes-large-partial.csv; } > /tmp/sizes.csv
for i in 1 2 3; do /usr/bin/time -f "real %e user %U" taskset -c 0,1 python3 -m scalefit sizes /tmp/sizes.csv --holdout large --json /tmp/s.json > /tmp/s.txt 2>> $OUT/cpu/real-alone.txt; done
( taskset -c 0,1 timeout 400 python3 -m tests.bench_sizes --builds-only > $OUT/cpu/bench-builds-alone.txt 2>&1 )
taskset -c 0 python3 -c "while True: pass" & H1=$!
taskset -c 1 python3 -c "while True: pass" & H2=$!
for i in 1 2 3; do /usr/bin/time -f "real %e user %U" taskset -c 0,1 python3 -m scalefit sizes /tmp/sizes.csv --holdout large --json /tmp/s.json > /tmp/s.txt 2>> $OUT/cpu/real-loaded.txt; done
( taskset -c 0,1 timeout 200 python3 -m tests.bench_sizes --builds-only > $OUT/cpu/bench-builds-loaded.txt 2>&1 )
kill $H1 $H2
cp /tmp/s.txt $OUT/cpu/sizes-out.txt
cat $OUT/cpu/*.txt | tail -60
