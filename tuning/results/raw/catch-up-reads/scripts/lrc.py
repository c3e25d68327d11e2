# server on CPU 0 sends FILE over loopback; client on CPU 1 receives. Reports MB/s, client and server CPU s/GB.
import os, socket, sys, time, resource, mmap
mode = sys.argv[1]; path = sys.argv[2]; size = os.path.getsize(path)
port = 39200 + hash(mode) % 100
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {0})
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(('127.0.0.1', port)); ls.listen(1)
    c, _ = ls.accept()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    if mode == 'sendfile':
        fd = os.open(path, os.O_RDONLY); off = 0
        while off < size:
            n = os.sendfile(c.fileno(), fd, off, min(1 << 20, size - off)); off += n
    elif mode == 'direct-send':
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 1 << 20); buf.write(b'\0' * (1 << 20)); off = 0
        while off < size:
            n = os.preadv(fd, [buf], off); c.sendall(memoryview(buf)[:n]); off += n
    else:
        fd = os.open(path, os.O_RDONLY)
        buf = bytearray(1 << 20); off = 0
        while off < size:
            n = os.preadv(fd, [buf], off); c.sendall(memoryview(buf)[:n]); off += n
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    os.write(w, str((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)).encode())
    c.close(); os._exit(0)
os.sched_setaffinity(0, {1})
time.sleep(0.3)
s = socket.create_connection(('127.0.0.1', port))
buf = bytearray(1 << 20); got = 0
r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.time()
while True:
    n = s.recv_into(buf)
    if n == 0: break
    got += n
t1 = time.time(); r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
os.waitpid(pid, 0); scpu = float(os.read(r, 100))
print(f'{mode} {path}: {got/1e6/(t1-t0):.0f} MB/s, client CPU {cpu/(got/1e9):.3f} s/GB, server CPU {scpu/(got/1e9):.3f} s/GB')
