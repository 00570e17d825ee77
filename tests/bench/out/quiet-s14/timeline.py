# Usage: python3 timeline.py RUN/multihop.json: B's, A's and E's levels, limits, queues per 100 ms sample
import json,sys
d=json.load(open(sys.argv[1]));r=d['result']['runs'][0];S=r['samples'];au=r['authorities']
def lv(x):
    if x is None: return '-'
    x=int(x); return 'open' if x>=32767 else f"{x//128}.{x%128:03d}"
prev=None
for s in S:
    h=s['hops'];a=h['a'];b=h['b'];e=h['e']
    aok=s['app_a']['ok']
    if prev:
        dx=aok[0]-prev['app_a']['ok'][0]; dy=aok[1]-prev['app_a']['ok'][1]
        db=s['b']['received']-prev['b']['received']
        dsh=a['inbound_shed_overload']-prev['hops']['a']['inbound_shed_overload']
        dshd=a['inbound_shed_deadline']-prev['hops']['a']['inbound_shed_deadline']
        de=e['inbound_shed_overload']-prev['hops']['e']['inbound_shed_overload']
    else: dx=dy=db=dsh=dshd=de=0
    prev=s
    print(f"{s['at_secs']:5.1f} B {lv(b['level']):>9} lim {b['inflight_limit']:3.0f} in {b['inflight']:3.0f} q {b['queue_depth']:3.0f} rcv {db:3} | A {lv(a['level']):>9} A>B {lv(a['cached'].get(au['b'])):>9} lim {a['inflight_limit']:3.0f} in {a['inflight']:3.0f} q {a['queue_depth']:3.0f} spared {a['spared_routes']} shed {dsh:3}/{dshd:3} | E>A {lv(e['cached'].get(au['a'])):>9} Eshed {de:3} | okX {dx:3} okY {dy:3}")
