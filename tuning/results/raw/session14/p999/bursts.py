import sys, collections
# perf script -F comm,tid,time,ip,sym output: header line then indented frames, blank line between samples
samples=[]
cur=None
for line in open(sys.argv[1]):
    if not line.strip():
        if cur: samples.append(cur); cur=None
        continue
    if not line.startswith((' ','\t')):
        parts=line.split()
        t=float(parts[-1].rstrip(':'))
        comm=' '.join(parts[:-2])
        cur=(t,comm,[])
    else:
        f=line.split(None,1)
        if cur and len(f)>1: cur[2].append(f[1].strip())
if cur: samples.append(cur)
min_ms=float(sys.argv[2]) if len(sys.argv)>2 else 1.5
busy=[]; run=[]
for s in samples:
    if s[1].startswith('swapper'):
        if run: busy.append(run)
        run=[]
    else:
        if run and s[0]-run[-1][0] > 0.0005:  # gap in samples: treat as break
            busy.append(run); run=[]
        run.append(s)
if run: busy.append(run)
long=[r for r in busy if (r[-1][0]-r[0][0])*1000 >= min_ms]
print(f"{len(samples)} samples, {len(busy)} busy runs, {len(long)} of >= {min_ms} ms")
for r in long:
    d=(r[-1][0]-r[0][0])*1000
    comms=collections.Counter(s[1] for s in r)
    # frames: count function names appearing anywhere in stacks (inclusive), top 6 non-generic
    inc=collections.Counter()
    for s in r:
        for fn in set(s[2]): inc[fn]+=1
    print(f"\n{r[0][0]:.4f} {d:.2f} ms, {len(r)} samples: {dict(comms)}")
    for fn,c in inc.most_common(14):
        print(f"   {c:4d} {fn[:110]}")
