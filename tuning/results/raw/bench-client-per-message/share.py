import sys,collections
# usage: share.py folded [depth-key]
tot=0; thr=collections.Counter(); leaf=collections.Counter(); incl=collections.Counter()
for line in open(sys.argv[1]):
    stack,_,n=line.rstrip().rpartition(' ')
    n=int(n); tot+=n
    fr=stack.split(';')
    thr[fr[0]]+=n; leaf[fr[-1]]+=n
    for f in set(fr): incl[f]+=n
print('total',tot)
print('== threads'); [print(f'{v/tot*100:6.2f} {k}') for k,v in thr.most_common(12)]
print('== self'); [print(f'{v/tot*100:6.2f} {k[:120]}') for k,v in leaf.most_common(35)]
if len(sys.argv)>2:
    print('== incl'); [print(f'{v/tot*100:6.2f} {k[:120]}') for k,v in incl.most_common(int(sys.argv[2]))]
