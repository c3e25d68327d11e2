#!/usr/bin/env bash
# Loopback send cost of a 1 GiB file by how the sender reads it (lrc.py), 3 rounds.
# Each round: fresh files written with O_DIRECT (never in the page cache), the
# source evicted, 20 s for freed memory to be reported to the host, then each mode
# once on its own fresh file, then sendfile again on the file already read.
set -euo pipefail
D=/work/tmp-lrc; mkdir -p $D; cd $D
for round in 1 2 3; do
  dd if=/dev/urandom of=src bs=1M count=1024 status=none
  for f in a b c; do dd if=src of=$f bs=1M oflag=direct status=none; done
  python3 -c "import os; fd=os.open('src',os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)"
  rm src; sync; sleep 20
  echo "round $round, page cache $(grep -E '^Cached' /proc/meminfo | awk '{print $2}') kB"
  python3 /tmp/s12/lrc.py sendfile a
  python3 /tmp/s12/lrc.py pread-send b
  python3 /tmp/s12/lrc.py direct-send c
  python3 /tmp/s12/lrc.py sendfile a
  rm -f a b c; sleep 2
done
rm -rf $D
