# Usage: python3 classify.py 'DIR/s*/multihop.json' (runs kept with MULTIHOP_KEEP_SAMPLES=1)
import json,sys,glob,re,statistics as st
rows=[]
for f in sorted(glob.glob(sys.argv[1]),key=lambda p:int(re.findall(r'(\d+)/multihop.json',p)[0])):
    d=json.load(open(f));r=d['result']['runs'][0];S=r['samples']
    if not S: continue
    md=open(f.replace('.json','.md')).read()
    m=re.search(r'^\| steady[^\n]*',md,re.M).group(0).split('|')
    good,ysucc,xtop,xe=[x.strip() for x in (m[4],m[6],m[7],m[8])]
    cnt=[s for s in S if s['at_secs']>=5.0]
    onset=[s for s in S if 2.0<=s['at_secs']<5.0]
    amin=min(s['hops']['a']['inflight_limit'] for s in cnt); amin_on=min(s['hops']['a']['inflight_limit'] for s in onset)
    bmin=min(s['hops']['b']['inflight_limit'] for s in cnt)
    nospare=sum(1 for s in cnt if not s['hops']['a']['spared_routes'])/len(cnt)
    aq=max(s['hops']['a']['queue_depth'] for s in cnt)
    bl=[s['hops']['b']['level'] for s in cnt]; 
    b2=sum(1 for x in bl if x>=256 and x<32767)/len(bl); bopen=sum(1 for x in bl if x>=32767)/len(bl)
    print(f"{f.split('/')[-2]:>4} good {good:>6} Y {ysucc:>6} Xtop {xtop:>6} XatE {xe:>6} | A lim min {amin:3.0f} (onset {amin_on:3.0f}) Aq max {aq:3.0f} A not sparing {nospare:4.0%} | B lim min {bmin:3.0f} B level>=2.x {b2:4.0%} open {bopen:4.0%}")
