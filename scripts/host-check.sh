#!/usr/bin/env bash
# Check a Linux host for running fjord (and for fair broker benchmarks) and
# print what to change. Read-only: it changes nothing. Exit code 0 always;
# lines starting with "CHANGE" are recommendations.
set -u
ok() { printf 'ok      %s\n' "$*"; }
chg() { printf 'CHANGE  %s\n' "$*"; }
info() { printf 'info    %s\n' "$*"; }

info "kernel $(uname -r), $(nproc) online CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"

# io_uring and locked memory (glommio pins 3 x io-memory per shard).
kmaj=$(uname -r | cut -d. -f1); kmin=$(uname -r | cut -d. -f2)
if [ "$kmaj" -gt 5 ] || { [ "$kmaj" -eq 5 ] && [ "$kmin" -ge 8 ]; }; then ok "kernel >= 5.8 (io_uring features glommio needs)"; else chg "kernel $(uname -r) < 5.8: upgrade for io_uring"; fi
if [ -r /proc/sys/kernel/io_uring_disabled ] && [ "$(cat /proc/sys/kernel/io_uring_disabled)" != 0 ]; then chg "io_uring is disabled: sysctl kernel.io_uring_disabled=0"; fi
ml=$(ulimit -l)
if [ "$ml" = unlimited ]; then ok "RLIMIT_MEMLOCK unlimited"; else
  need=$(( 3 * 8 * 1024 * $(nproc) ))
  if [ "$ml" -ge "$need" ]; then ok "RLIMIT_MEMLOCK ${ml} KiB"; else chg "RLIMIT_MEMLOCK ${ml} KiB < ${need} KiB (3 x 8 MiB per shard): ulimit -l unlimited, LimitMEMLOCK=infinity in the systemd unit, or grant CAP_IPC_LOCK"; fi
fi

# CPU frequency governor.
govs=$(cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor 2>/dev/null | sort -u | tr '\n' ' ')
if [ -z "$govs" ]; then info "no cpufreq (VM or fixed frequency)"; elif [ "$govs" = "performance " ]; then ok "governor performance"; else chg "governor: $govs-> cpupower frequency-set -g performance"; fi
if [ -r /sys/devices/system/cpu/intel_pstate/no_turbo ]; then info "intel_pstate no_turbo=$(cat /sys/devices/system/cpu/intel_pstate/no_turbo) (fix it one way for all compared runs)"; fi

# Isolated cores and IRQ placement.
iso=$(cat /sys/devices/system/cpu/isolated 2>/dev/null)
if [ -n "$iso" ]; then ok "isolated CPUs: $iso (run shards there with --cores and pinning)"; else info "no isolcpus: for lowest tail latency boot with isolcpus=/nohz_full=/rcu_nocbs= for the shard cores"; fi
if pgrep -x irqbalance >/dev/null; then chg "irqbalance is running: stop it and pin NIC IRQs away from shard cores (/proc/irq/N/smp_affinity_list)"; else ok "irqbalance not running"; fi
# Disk completions: the CPUs that have taken each block-queue interrupt so far
# (NVMe and virtio-blk queues usually have managed affinity, which cannot be
# moved; place the writing shard there, not a benchmark client).
awk 'NR == 1 { ncpu = NF; next }
     /nvme|virtio.*-req|blk/ {
       cpus = ""
       for (i = 2; i <= ncpu + 1; i++) if ($i + 0 > 0) cpus = cpus (cpus == "" ? "" : ",") (i - 2)
       if (cpus != "") printf "info    disk IRQ %s %s: completions on CPU %s\n", $1, $NF, cpus
     }' /proc/interrupts 2>/dev/null
# Kernel threads that wake on a timer and run for milliseconds on any CPU:
# DAMON's kdamond samples memory every sample_us (on the 2-core VM: every
# 500 ms, 1-4 ms each time, on whichever CPU it lands, shard or client).
for pid in $(pgrep -x 'kdamond\.[0-9]+' 2>/dev/null); do
  aff=$(taskset -pc "$pid" 2>/dev/null | awk -F': ' '{print $2}')
  ni=$(ps -o ni= -p "$pid" 2>/dev/null | tr -d ' ')
  chg "$(cat /proc/$pid/comm) (pid $pid, CPUs $aff, nice $ni): DAMON runs 1-4 ms bursts on these CPUs; stop it if nothing needs it (state off under /sys/kernel/mm/damon/admin/kdamonds/), or keep it off the shard cores (taskset -pc NON_SHARD_CPUS $pid) and renice -n 19 -p $pid"
done
# Transparent huge pages: fjord's staging buffers ask for them (MADV_HUGEPAGE).
if [ -r /sys/kernel/mm/transparent_hugepage/enabled ]; then
  thp=$(cat /sys/kernel/mm/transparent_hugepage/enabled)
  case "$thp" in
    *"[never]"*) chg "transparent huge pages: $thp: set madvise (echo madvise > /sys/kernel/mm/transparent_hugepage/enabled); fjord's write buffers ask for huge pages" ;;
    *) ok "transparent huge pages: $thp" ;;
  esac
fi

# Swap.
sw=$(cat /proc/sys/vm/swappiness 2>/dev/null || echo '?')
if [ "$sw" != '?' ] && [ "$sw" -gt 10 ]; then chg "vm.swappiness=$sw: set 1 (sysctl vm.swappiness=1)"; else ok "vm.swappiness=$sw"; fi

# Network.
check_sysctl() { # name min
  v=$(sysctl -n "$1" 2>/dev/null | awk '{print $NF}')
  if [ -z "$v" ]; then info "$1 not readable"; elif [ "$v" -ge "$2" ]; then ok "$1=$v"; else chg "$1=$v: sysctl -w $1=$2"; fi
}
check_sysctl net.core.somaxconn 4096
check_sysctl net.core.rmem_max 16777216
check_sysctl net.core.wmem_max 16777216
check_sysctl net.ipv4.tcp_max_syn_backlog 4096
check_sysctl net.core.netdev_max_backlog 16384

# File system of the data directory.
dir=${1:-./data}
mkdir -p "$dir" 2>/dev/null
fs=$(stat -f -c %T "$dir" 2>/dev/null)
opts=$(findmnt -n -o OPTIONS --target "$dir" 2>/dev/null)
case "$fs" in
  xfs) ok "data dir $dir on xfs" ;;
  ext2/ext3) info "data dir $dir on ext4: works; XFS handles concurrent O_DIRECT appends and fallocate better" ;;
  tmpfs) chg "data dir $dir on tmpfs: O_DIRECT is not supported there; use a real disk" ;;
  overlayfs) chg "data dir $dir on overlayfs (container layer): mount a volume for data" ;;
  *) info "data dir $dir on $fs" ;;
esac
case ",$opts," in *,noatime,*|*,relatime,*) ok "mount options: $opts" ;; *) chg "mount $dir with noatime (options: $opts)" ;; esac
