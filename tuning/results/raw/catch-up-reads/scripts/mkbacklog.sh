#!/usr/bin/env bash
# usage: mkbacklog.sh BIN DIR PORT -- starts a broker on CPU 0 and produces 400 MB (1 KiB msgs, 256 KiB batches) to topic rep
bin=$1; dir=$2; port=$3; rm -rf $dir
(setsid taskset -c 0 $bin serve --data-dir $dir --port $port --listen 127.0.0.1 --cores 1 --no-pin > $dir.log 2>&1 &)
sleep 2
taskset -c 1 $bin bench --bootstrap 127.0.0.1:$port --topic rep --partitions 1 --message-size 1024 --rate 50000 --duration 8s --warmup 0s --consumers 0 --linger-ms 5 --batch-size 1048576 --output /tmp/s12/rep > /dev/null 2>&1
