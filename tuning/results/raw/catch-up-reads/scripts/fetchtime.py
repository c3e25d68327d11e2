# Times raw Fetch v4 requests (1 MiB partition max) walking a backlog from offset START:
# per fetch, time to first response byte and to the last byte. usage: fetchtime.py PORT TOPIC START N
import socket, struct, sys, time
port=int(sys.argv[1]); t=sys.argv[2].encode(); off=int(sys.argv[3]); N=int(sys.argv[4])
s=socket.create_connection(('127.0.0.1',port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf=bytearray(8<<20)
def rd_exact(n):
    mv=memoryview(buf); got=0
    while got<n:
        k=s.recv_into(mv[got:n]); 
        if k==0: raise SystemExit('eof')
        got+=k
    return mv[:n]
tt=[];tf=[];sizes=[]
for i in range(N):
    body=struct.pack('>hhih',1,4,i,3)+b'cli'+struct.pack('>iiiib',-1,100,1,52428800,0)+struct.pack('>ih',1,len(t))+t+struct.pack('>iiqi',1,0,off,1<<20)
    t0=time.perf_counter(); s.sendall(struct.pack('>i',len(body))+body)
    hdr=rd_exact(4); t1=time.perf_counter(); n=struct.unpack('>i',hdr)[0]; r=bytes(rd_exact(n)); t2=time.perf_counter()
    p=8; p+=4; ln=struct.unpack('>h',r[p:p+2])[0]; p+=2+ln+4+22; na=struct.unpack('>i',r[p:p+4])[0]; p+=4+max(na,0)*16
    rs=struct.unpack('>i',r[p:p+4])[0]; p+=4; rec=r[p:p+rs]; q=0; last=off
    while q+12<=len(rec):
        bo,bl=struct.unpack('>qi',rec[q:q+12])
        if q+12+bl>len(rec): break
        cnt=struct.unpack('>i',rec[q+57:q+61])[0]; last=bo+cnt; q+=12+bl
    off=last; tf.append((t1-t0)*1e3); tt.append((t2-t0)*1e3); sizes.append(rs)
tf.sort(); tt.sort()
print(f'{N} fetches, {sum(sizes)/N/1e6:.2f} MB each: first byte p50 {tf[N//2]:.2f} ms, whole p50 {tt[N//2]:.2f} ms, min {tt[0]:.2f}, p90 {tt[int(N*.9)]:.2f}; {sum(sizes)/sum(tt)*1e3/1e6:.0f} MB/s')
