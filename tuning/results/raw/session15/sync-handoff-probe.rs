// Probe: latency of one "buffered page write + fdatasync" cycle, with the
// fdatasync done different ways, from a glommio executor pinned to CPU 0.
use futures::channel::oneshot;
use glommio::io::DmaFile;
use glommio::{LocalExecutorBuilder, Placement};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Instant;

const N: usize = 20000;

fn pct(v: &mut Vec<u64>, p: f64) -> f64 {
    let i = ((v.len() as f64 - 1.0) * p) as usize;
    v[i] as f64 / 1000.0
}

fn report(name: &str, mut v: Vec<u64>) {
    v.sort();
    println!(
        "{name:28} p50 {:7.1} us  p90 {:7.1}  p99 {:7.1}  p99.9 {:7.1}  max {:7.1}",
        pct(&mut v, 0.5), pct(&mut v, 0.9), pct(&mut v, 0.99), pct(&mut v, 0.999), pct(&mut v, 1.0)
    );
}

enum Mode { Uring, Inline, Thread(Option<usize>) }

fn main() {
    let modes: Vec<String> = std::env::args().skip(1).collect();
    let path = "/work/syncprobe.dat";
    // Pre-write the file so overwrites hit written blocks.
    {
        let f = std::fs::OpenOptions::new().create(true).write(true).open(path).unwrap();
        let buf = vec![0u8; 1 << 20];
        use std::os::unix::fs::FileExt;
        for i in 0..64 { f.write_all_at(&buf, i << 20).unwrap(); }
        f.sync_all().unwrap();
    }
    for m in modes {
        let mode = match m.as_str() {
            "uring" => Mode::Uring,
            "inline" => Mode::Inline,
            "thread0" => Mode::Thread(Some(0)),
            "thread1" => Mode::Thread(Some(1)),
            "threadany" => Mode::Thread(None),
            _ => panic!("mode"),
        };
        let name = m.clone();
        let ex = LocalExecutorBuilder::new(Placement::Fixed(0)).spawn(move || async move {
            let wf = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            let wfd = wf.as_raw_fd();
            let sf = DmaFile::open(path).await.unwrap();
            let sfd = sf.as_raw_fd();
            let (tx, rx) = mpsc::channel::<(i32, oneshot::Sender<i32>)>();
            if let Mode::Thread(cpu) = mode {
                std::thread::spawn(move || {
                    if let Some(c) = cpu { core_affinity::set_for_current(core_affinity::CoreId { id: c }); }
                    else {
                        unsafe {
                            let mut set: libc::cpu_set_t = std::mem::zeroed();
                            libc::CPU_SET(0, &mut set); libc::CPU_SET(1, &mut set);
                            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                        }
                    }
                    while let Ok((fd, done)) = rx.recv() {
                        let r = unsafe { libc::fdatasync(fd) };
                        let _ = done.send(r);
                    }
                });
            }
            let page = vec![7u8; 4096];
            let mut lat = Vec::with_capacity(N);
            for i in 0..N {
                let t = Instant::now();
                let pos = ((i / 40) * 4096) as i64; // ~100 B appends: 40 per page
                let r = unsafe { libc::pwrite(wfd, page.as_ptr() as *const _, 4096, pos) };
                assert_eq!(r, 4096);
                match mode {
                    Mode::Uring => sf.fdatasync().await.unwrap(),
                    Mode::Inline => { assert_eq!(unsafe { libc::fdatasync(sfd) }, 0); }
                    Mode::Thread(_) => {
                        let (dtx, drx) = oneshot::channel();
                        tx.send((sfd, dtx)).unwrap();
                        assert_eq!(drx.await.unwrap(), 0);
                    }
                }
                lat.push(t.elapsed().as_nanos() as u64);
                // 10k/s-ish pacing: a short idle gap like a request stream would leave.
                glommio::timer::sleep(std::time::Duration::from_micros(50)).await;
            }
            drop(tx);
            lat
        }).unwrap();
        let lat = ex.join().unwrap();
        report(&name, lat);
    }
}
