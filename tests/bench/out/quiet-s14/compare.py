# Usage: python3 compare.py PREFIX... (run folders /tmp/mh/PREFIX<n>/multihop.json, kept with MULTIHOP_KEEP_SAMPLES=1)
import json,glob,re,sys,statistics as st
from collections import defaultdict
def load(prefix):
    rows=[]
    for f in glob.glob(f'/tmp/mh/{prefix}[0-9]*/multihop.json'):
        try: r=json.load(open(f))['result']['runs'][0]
        except Exception: continue
        md=open(f.replace('.json','.md')).read()
        m=re.search(r'^\| steady[^\n]*',md,re.M).group(0).split('|')
        good,y,xtop,xe,waste,brf=[float(x.strip().rstrip('%')) for x in (m[4],m[6],m[7],m[8],m[9],m[10])]
        S=r['samples']; cnt=[s for s in S if s['at_secs']>=5.0]
        bl=[s['hops']['b']['level'] for s in cnt]
        bopen=sum(x>=32767 for x in bl)/len(bl); btop=sum(x<128 for x in bl)/len(bl)
        kind='open' if bopen>=0.5 else ('top' if btop>=0.3 else 'cut')
        peak=max(s['b']['peak_outstanding'] for s in S)
        late=S[-1]['b']['started_late']
        bmin=min(s['hops']['b']['inflight_limit'] for s in S if s['at_secs']>=2.5)
        rows.append(dict(kind=kind,good=good,y=y,xtop=xtop,xe=xe,waste=waste,brf=brf,peak=peak,late=late,bmin=bmin))
    return rows
for p in sys.argv[1:]:
    rows=load(p); n=len(rows)
    med=lambda k: st.median(r[k] for r in rows)
    kinds=defaultdict(int)
    for r in rows: kinds[r['kind']]+=1
    print(f"{p}: {n} runs; B open/top/cut {kinds['open']}/{kinds['top']}/{kinds['cut']}; medians goodput {med('good'):.1f} Y {med('y'):.1f} Xtop {med('xtop'):.1f} XatE {med('xe'):.1f} waste {med('waste'):.1f} Brefused {med('brf'):.1f}; min goodput {min(r['good'] for r in rows):.1f} Xtop {min(r['xtop'] for r in rows):.1f} Y {min(r['y'] for r in rows):.1f}; met goodput {sum(r['good']>=95 for r in rows)} Y {sum(r['y']>=99.5 for r in rows)} Xtop {sum(r['xtop']>=99.5 for r in rows)} XatE {sum(r['xe']>=95 for r in rows)} all {sum(r['good']>=95 and r['y']>=99.5 and r['xtop']>=99.5 and r['xe']>=95 for r in rows)}; B app peak median {med('peak')} max {max(r['peak'] for r in rows)}; started late median {med('late')}; B lim min (after 2.5 s) median {med('bmin')} min {min(r['bmin'] for r in rows)}")
