use std::time::Instant;
unsafe fn region(bytes: usize, huge: bool) -> *mut u8 {
    let two = 2usize << 20;
    let p = libc::mmap(std::ptr::null_mut(), bytes + two, libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) as usize;
    let a = (p + two - 1) / two * two;
    if huge { libc::madvise(a as *mut _, bytes, libc::MADV_HUGEPAGE); }
    let s = std::slice::from_raw_parts_mut(a as *mut u8, bytes);
    for (i, b) in s.iter_mut().enumerate() { *b = i as u8; }
    a as *mut u8
}
fn cpu() -> f64 { let mut r: libc::rusage = unsafe { std::mem::zeroed() }; unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    r.ru_utime.tv_sec as f64 + r.ru_utime.tv_usec as f64 / 1e6 + r.ru_stime.tv_sec as f64 + r.ru_stime.tv_usec as f64 / 1e6 }
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1]; let huge = args[2] == "huge"; let wlen: usize = args[3].parse().unwrap();
    let total: usize = 2 << 30;
    let bufsz = 8 << 20;
    let buf = unsafe { region(bufsz, huge) };
    let c = std::ffi::CString::new(path.as_str()).unwrap();
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_CREAT | libc::O_RDWR | libc::O_DIRECT | libc::O_TRUNC, 0o644) };
    assert!(fd >= 0);
    unsafe { libc::fallocate(fd, 0, 0, total as i64) };
    let t = Instant::now(); let c0 = cpu();
    let mut pos = 0usize;
    while pos < total {
        let off = pos % bufsz;
        let n = unsafe { libc::pwrite(fd, buf.add(off) as *const _, wlen, pos as i64) };
        assert_eq!(n as usize, wlen);
        pos += wlen;
    }
    let c1 = cpu(); let w = t.elapsed().as_secs_f64();
    println!("{} wlen {}K: {:.3} CPU s/GB, {:.0} MB/s", if huge {"huge "} else {"small"}, wlen >> 10, (c1 - c0) / (total as f64 / 1e9), total as f64 / 1e6 / w);
    unsafe { libc::close(fd) }; std::fs::remove_file(path).unwrap();
    let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    for l in smaps.lines() { if l.starts_with("AnonHugePages") { println!("  {l}"); } }
}
